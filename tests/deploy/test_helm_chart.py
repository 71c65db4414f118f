"""The Helm chart, rendered offline: every built-in object validates against the Kubernetes schemas, every
setting it passes is one prewarm knows, every command is a real one, and the values checks refuse what
would install but not work (more ingest replicas than partitions, a retrain in two places)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_render import (
    CHART,
    PRODUCTION,
    RenderError,
    containers,
    env_of,
    kinds,
    lint,
    one,
    pod_spec,
    render,
    workloads,
)
from typer.testing import CliRunner

from models import Catalog
from prewarm import Settings, load_settings
from prewarm_cli import app
from scheduler import Cluster

Obj = dict[str, Any]
# The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest schemas shipped.
KUBERNETES_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
VALUES = {"default": None, "production": PRODUCTION}


@cache
def rendered(name: str) -> list[Obj]:
    return render(values=VALUES[name])


@pytest.mark.parametrize("values", VALUES)
def test_chart_passes_helm_lint_strictly(values: str) -> None:
    result = lint(VALUES[values])
    assert result.returncode == 0, result.stdout + result.stderr


def _built_in(obj: Obj) -> bool:
    """Kubernetes' API groups: the core group (no dot) and *.k8s.io; anything else is a custom resource."""
    group = obj["apiVersion"].rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", VALUES)
def test_every_built_in_object_validates_against_the_kubernetes_schemas(values: str, version: str) -> None:
    objects = [o for o in rendered(values) if _built_in(o)]
    # Production refers to Secrets it does not make (existingSecret); the defaults make them.
    wanted = {
        "DaemonSet",
        "Deployment",
        "CronJob",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }
    assert wanted | ({"Secret"} if values == "default" else {"Ingress"}) <= {o["kind"] for o in objects}
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{obj['kind']} {obj['metadata']['name']} (k8s {version}): {exc.message} at {list(exc.path)}"
            )


def _custom_resources() -> list[Obj]:
    # Read while collecting, where a skip for a missing helm would be a collection error: the other
    # tests of the module say that helm is missing themselves.
    try:
        return [o for o in rendered("production") if not _built_in(o)]
    except (RenderError, pytest.skip.Exception):
        return []


@pytest.mark.parametrize("obj", _custom_resources(), ids=lambda o: f"{o['kind']}-{o['metadata']['name']}")
def test_custom_resources_have_no_schema_to_validate_against(obj: Obj) -> None:
    pytest.skip(
        f"{obj['apiVersion']} {obj['kind']} is a custom resource: kubernetes-validate ships no schema for it"
    )


def test_service_monitor_is_off_by_default_and_scrapes_every_metrics_service_when_on() -> None:
    assert kinds(rendered("default"), "ServiceMonitor") == []
    objects = rendered("production")
    [monitor] = kinds(objects, "ServiceMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    scraped = [s for s in kinds(objects, "Service") if wanted.items() <= s["metadata"]["labels"].items()]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in scraped} == {
        "scheduler",
        "ingest",
        "executor",
    }
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    for service in scraped:
        assert ports & {p["name"] for p in service["spec"]["ports"]}, service["metadata"]["name"]


def _known_settings() -> set[str]:
    names = {"PREWARM_CONFIG"}
    for section in Settings.model_fields.values():
        assert isinstance(section.annotation, type)
        names |= {f"PREWARM_{field.upper()}" for field in section.annotation.model_fields}
    return names


@pytest.mark.parametrize("values", VALUES)
@pytest.mark.usefixtures("clean_env")
def test_every_prewarm_setting_the_chart_passes_is_known_and_valid(values: str, tmp_path: Path) -> None:
    # prewarm refuses a PREWARM_ name it does not know at start-up: a typo in the chart is a pod that
    # never starts. Load each container's settings the way its process will.
    objects = rendered(values)
    [config] = [c for c in kinds(objects, "ConfigMap") if c["metadata"]["name"].endswith("-config")]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config["data"]["config.yaml"])
    known = _known_settings()
    for workload in workloads(objects):
        for container in containers(workload):
            env = env_of(container)
            prewarm = {name: e for name, e in env.items() if name.startswith("PREWARM_")}
            assert set(prewarm) <= known, f"{container['name']}: unknown {set(prewarm) - known}"
            assert prewarm["PREWARM_CONFIG"]["value"] == "/etc/prewarm/config/config.yaml"
            literal = {
                name.removeprefix("PREWARM_").lower(): e["value"]
                for name, e in prewarm.items()
                if "value" in e and name != "PREWARM_CONFIG"
            }
            settings = load_settings(config_file=config_file, overrides=literal)
            assert (
                settings.kafka.kafka_bootstrap == yaml.safe_load(config_file.read_text())["kafka_bootstrap"]
            )


@pytest.mark.parametrize("values", VALUES)
def test_every_container_runs_a_real_prewarm_command(values: str) -> None:
    runner = CliRunner()
    commands = set()
    for workload in workloads(rendered(values)):
        for container in containers(workload):
            assert "command" not in container, "the image's ENTRYPOINT (prewarm) runs the args"
            result = runner.invoke(app, [*container["args"], "--help"])
            assert result.exit_code == 0, f"prewarm {' '.join(container['args'])}: {result.output}"
            commands.add(" ".join(container["args"]))
        for init in containers(workload, init=True):
            # The one exception: giving the executor's host directories to its uid.
            assert init["name"] == "host-dirs"
            assert init["command"][0] == "chown"
    assert commands == {"scheduler run", "ingest run", "forecast train", "executor run"}


@pytest.mark.parametrize("values", VALUES)
def test_every_pod_runs_as_the_non_root_images_user(values: str) -> None:
    uid = yaml.safe_load((CHART / "values.yaml").read_text())["securityContext"]["uid"]
    for workload in workloads(rendered(values)):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == uid
        for container in containers(workload):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_scheduler_runs_two_replicas_each_named_by_its_pod_in_the_lease() -> None:
    scheduler = one(rendered("default"), "Deployment", "scheduler")
    assert scheduler["spec"]["replicas"] == 2
    [container] = containers(scheduler)
    replica = env_of(container)["PREWARM_REPLICA_ID"]
    assert replica["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    budget = one(rendered("default"), "PodDisruptionBudget", "scheduler")
    assert budget["spec"]["minAvailable"] == 1


@pytest.mark.parametrize("cronjob", [True, False])
def test_the_daily_retrain_runs_in_exactly_one_place(cronjob: bool) -> None:
    objects = render(
        f"--set=retrain.cronJob.enabled={str(cronjob).lower()}", "--set=retrain.schedule=15 2 * * *"
    )
    [container] = containers(one(objects, "Deployment", "scheduler"))
    in_process = env_of(container)["PREWARM_RETRAIN_CRON"]["value"]
    jobs = kinds(objects, "CronJob")
    if cronjob:
        [job] = jobs
        assert (job["spec"]["schedule"], job["spec"]["timeZone"]) == ("15 2 * * *", "Etc/UTC")
        assert in_process == ""
    else:
        assert jobs == []
        assert in_process == "15 2 * * *"


def test_a_retrain_schedule_set_as_a_plain_setting_is_refused() -> None:
    with pytest.raises(RenderError, match=r"retrain\.schedule"):
        render("--set=settings.retrain_cron=0 4 * * *")
    with pytest.raises(RenderError, match=r"retrain\.schedule"):
        render("--set=scheduler.settings.retrain_cron=0 4 * * *")


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("executor.settings.socket_dir=/tmp/x", "executor.handoff.hostPath"),
        ("settings.api_port=9000", "scheduler.port"),
        ("ingest.settings.database_url=sqlite:////tmp/x.db", "credentials.databaseUrl"),
        ("scheduler.settings.read_tokens=a:b", "tokens.readTokens"),
    ],
)
def test_a_setting_the_chart_sets_itself_is_refused_in_a_settings_map(where: str, why: str) -> None:
    # Given twice, one would silently lose: the environment beats the config file.
    with pytest.raises(RenderError, match=re.escape(f"is set by the chart: use {why}")):
        render(f"--set={where}")


@pytest.mark.parametrize("values", VALUES)
def test_no_container_sets_one_variable_twice(values: str) -> None:
    for workload in workloads(rendered(values)):
        for container in [*containers(workload), *containers(workload, init=True)]:
            names = [e["name"] for e in container.get("env", [])]
            assert len(names) == len(set(names)), f"{container['name']}: {names}"


def test_ingest_replicas_are_bounded_by_the_request_log_partitions() -> None:
    ingest = one(render("--set=ingest.replicas=12"), "Deployment", "ingest")
    assert ingest["spec"]["replicas"] == 12
    with pytest.raises(
        RenderError, match=re.escape("ingest.replicas (13) exceeds settings.topic_requests_partitions (12)")
    ):
        render("--set=ingest.replicas=13")
    assert one(
        render("--set=ingest.replicas=20", "--set=settings.topic_requests_partitions=24"),
        "Deployment",
        "ingest",
    )


def test_scheduler_replicas_without_a_shared_database_are_refused() -> None:
    with pytest.raises(RenderError, match="shared PostgreSQL"):
        render("--set=credentials.databaseUrl=sqlite:////var/lib/prewarm/prewarm.db")
    assert render("--set=credentials.databaseUrl=sqlite:////tmp/p.db", "--set=scheduler.replicas=1")


def test_executor_is_a_daemonset_on_gpu_nodes_with_l2_and_the_handoff_socket_on_the_node() -> None:
    objects = rendered("default")
    executor = one(objects, "DaemonSet", "executor")
    spec = pod_spec(executor)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["l2"]["hostPath"]["path"] == "/var/cache/prewarm"
    assert volumes["handoff"]["hostPath"]["path"] == "/run/prewarm"
    [container] = containers(executor)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    env = env_of(container)
    assert env["PREWARM_CACHE_DIR"]["value"] == mounts["l2"]
    assert Path(env["PREWARM_SOCKET_DIR"]["value"]).parent == Path(mounts["handoff"])
    assert env["PREWARM_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # Shared GPUs by default: every GPU of the node visible, none taken from the engines.
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    [init] = containers(executor, init=True)
    assert {m["mountPath"] for m in init["volumeMounts"]} == set(init["command"][2:])


def test_executor_requests_gpus_and_huge_pages_when_asked() -> None:
    objects = render(
        "--set=executor.gpu.mode=request", "--set=executor.gpu.count=8", "--set=executor.hugepages2Mi=64Gi"
    )
    executor = one(objects, "DaemonSet", "executor")
    [container] = containers(executor)
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 8
    # Kubernetes wants huge pages requested exactly as limited.
    assert resources["requests"]["hugepages-2Mi"] == resources["limits"]["hugepages-2Mi"] == "64Gi"
    assert "runtimeClassName" not in pod_spec(executor)
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(container)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)


def test_production_huge_pages_are_requested_exactly_as_limited() -> None:
    [container] = containers(one(rendered("production"), "DaemonSet", "executor"))
    resources = container["resources"]
    assert resources["requests"]["hugepages-2Mi"] == resources["limits"]["hugepages-2Mi"]


@pytest.mark.parametrize("values", VALUES)
def test_tokens_and_credentials_reach_the_containers_only_from_secrets(values: str) -> None:
    objects = rendered(values)
    secret = re.compile(r"TOKEN|PASSWORD|SECRET|DATABASE_URL|ACCESS_KEY")
    made = {s["metadata"]["name"] for s in kinds(objects, "Secret")}
    production = yaml.safe_load(PRODUCTION.read_text())
    existing = {production["tokens"]["existingSecret"], production["credentials"]["existingSecret"]}
    for workload in workloads(objects):
        for container in containers(workload):
            for name, entry in env_of(container).items():
                if secret.search(name):
                    ref = entry["valueFrom"]["secretKeyRef"]
                    assert ref["name"] in (made if values == "default" else existing), (name, ref)
    if values == "production":
        assert made == set(), "existing Secrets are referred to, never rendered"


def test_catalog_and_cluster_config_maps_hold_what_prewarm_reads() -> None:
    objects = rendered("default")
    maps = {c["metadata"]["name"]: c["data"] for c in kinds(objects, "ConfigMap")}
    catalog = Catalog.from_data(yaml.safe_load(maps["prewarm-catalog"]["catalog.yaml"]))
    assert list(catalog) == []
    cluster = Cluster.from_data(yaml.safe_load(maps["prewarm-cluster"]["cluster.yaml"]))
    assert [n.name for n in cluster.nodes] == ["gpu-node-1"]
    [container] = containers(one(objects, "Deployment", "scheduler"))
    env = env_of(container)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert Path(env["PREWARM_CATALOG"]["value"]) == Path(mounts["catalog"]) / "catalog.yaml"
    assert Path(env["PREWARM_CLUSTER"]["value"]) == Path(mounts["cluster"]) / "cluster.yaml"
    # Mounted whole, not by subPath: an edited ConfigMap reaches the running pod (the catalog watcher).
    assert not any("subPath" in m for m in container["volumeMounts"])


def test_a_changed_setting_restarts_the_pods_that_read_it_once() -> None:
    def checksums(objects: list[Obj]) -> dict[str, str]:
        return {
            w["metadata"]["name"]: pod_template_annotations(w)["checksum/config"] for w in workloads(objects)
        }

    before = checksums(rendered("default"))
    after = checksums(render("--set=settings.log_level=DEBUG"))
    assert before.keys() == after.keys()
    assert all(before[name] != after[name] for name in before)


def pod_template_annotations(workload: Obj) -> dict[str, str]:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return dict(spec["template"]["metadata"]["annotations"])


@pytest.mark.parametrize("values", VALUES)
def test_services_select_their_pods_and_the_ingress_routes_only_the_api(values: str) -> None:
    objects = rendered(values)
    pods = {w["metadata"]["labels"]["app.kubernetes.io/component"]: w for w in workloads(objects)}
    services = {s["metadata"]["name"]: s for s in kinds(objects, "Service")}
    for service in services.values():
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        labels = pods[component]["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        ports = {p["name"] for c in containers(pods[component]) for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    for ingress in kinds(objects, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                # The API and the status page; /metrics, /healthz and /readyz stay inside the cluster.
                assert path["path"] in ("/v1", "/status"), path["path"]
                backend = path["backend"]["service"]
                assert backend["port"]["name"] in {
                    p["name"] for p in services[backend["name"]]["spec"]["ports"]
                }
    assert bool(kinds(objects, "Ingress")) is (values == "production")


@pytest.mark.parametrize("values", VALUES)
def test_every_workload_is_covered_by_a_network_policy_and_a_budget_where_it_scales(values: str) -> None:
    objects = rendered(values)
    policies = kinds(objects, "NetworkPolicy")
    budgets = kinds(objects, "PodDisruptionBudget")
    for workload in workloads(objects):
        labels = workload["metadata"]["labels"]
        selected = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert selected, f"no NetworkPolicy selects {workload['metadata']['name']}"
        if workload["kind"] == "Deployment":
            assert [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]


@pytest.mark.usefixtures("clean_env")
def test_production_values_replicate_every_topic_across_three_brokers() -> None:
    values = yaml.safe_load(PRODUCTION.read_text())
    settings = load_settings(overrides={k: str(v) for k, v in values["settings"].items()})
    assert len(settings.kafka.kafka_bootstrap.split(",")) == 3
    assert settings.kafka.kafka_replication_factor == 3
    assert settings.kafka.min_insync_replicas == 2
    assert values["ingest"]["replicas"] <= settings.kafka.topic_requests_partitions


def test_every_top_level_value_is_documented_in_the_chart_readme() -> None:
    readme = (CHART / "README.md").read_text()
    for key in yaml.safe_load((CHART / "values.yaml").read_text()):
        assert f"`{key}" in readme, f"values key {key} is not in deploy/helm/prewarm/README.md"


def test_executor_api_leaves_loopback_only_with_a_token() -> None:
    # The executor refuses to serve its load API beyond loopback without a token: a chart that bound it
    # to 0.0.0.0 with no token would install an executor that never starts.
    def api_host(*args: str) -> str:
        [container] = containers(one(render(*args), "DaemonSet", "executor"))
        return str(env_of(container)["PREWARM_EXECUTOR_API_HOST"]["value"])

    assert api_host() == "127.0.0.1"
    assert api_host("--set=tokens.executorApiToken=t0ken") == "0.0.0.0"
    assert api_host("--set=tokens.existingSecret=prewarm-tokens") == "0.0.0.0"


def test_executor_probes_run_the_images_health_check_inside_the_container() -> None:
    [container] = containers(one(rendered("default"), "DaemonSet", "executor"))
    assert container["readinessProbe"]["exec"]["command"] == ["python", "/opt/prewarm/healthcheck.py"]
    for probe in ("livenessProbe", "startupProbe"):
        assert container[probe]["exec"]["command"][-1] == "--alive"
    port = container["ports"][0]["containerPort"]
    assert env_of(container)["HEALTHCHECK_URL"]["value"] == f"http://127.0.0.1:{port}/healthz"
