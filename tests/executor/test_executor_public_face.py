"""The executor's public API is small and pinned; a GPU node never imports the control plane."""

from __future__ import annotations

import subprocess
import sys

import executor


def test_public_api_is_pinned() -> None:
    assert sorted(executor.__all__) == [
        "Executor",
        "FileStore",
        "Layout",
        "LoadResult",
        "ObjectStore",
        "S3Store",
        "TensorEntry",
        "VerifyResult",
        "open_store",
        "parse_header",
        "register_store",
        "tensor_views",
    ]


def test_importing_executor_leaves_out_the_control_plane() -> None:
    code = (
        "import sys, executor, executor._executor, prewarm.cli._executor; "
        "heavy = {'pandas', 'statsmodels', 'mlflow', 'sqlalchemy', 'sklearn', 'boto3'}; "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # boto3 too: it is imported only when an s3:// store is opened.
    assert out.stdout.strip() == "[]"
