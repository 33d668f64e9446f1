"""Many dry runs of the repository's Snakefile in one process, through Snakemake's API: its start-up (~1 s of
imports) is paid once instead of once per run. For tests that only ask whether a study is refused, and with which
message; tests that check what the command line prints run ``snakemake`` itself.

    python tests/helpers/snakemake_batch.py REQUESTS.json RESULTS.json

REQUESTS: a list of {"name", "configfiles": [paths], "workdir", "targets": [files]}, each as ``snakemake -s
Snakefile -d WORKDIR -n --configfile CONFIGFILES -- TARGETS``. RESULTS: {name: {"exit": the SystemExit message or
None, "stage": where it stopped ("workflow": while the Snakefile was parsed, before any DAG; "dag": while the DAG
was built; "done"),
"error": any other exception as "Type: message", or None}}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SNAKEFILE = REPO / "Snakefile"


def dry_run(configfiles: list[str], workdir: str, targets: list[str]) -> dict:
    """One ``snakemake -n`` in this process; the stage it reached and how it stopped."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    stage, result = "workflow", {"exit": None, "error": None}
    cwd = os.getcwd()
    try:
        with SnakemakeApi(OutputSettings(dryrun=True, quiet=None)) as api:
            workflow = api.workflow(resource_settings=ResourceSettings(cores=1), snakefile=SNAKEFILE,
                                    config_settings=ConfigSettings(configfiles=[Path(f) for f in configfiles]),
                                    workdir=Path(workdir))
            workflow.dag(DAGSettings(targets=set(targets))).execute_workflow(executor="dryrun")
            stage = "done"
    except SystemExit as exc:
        result["exit"] = str(exc.code)
        # the Snakefile is parsed inside workflow.dag(): a DAG was being built only if snakemake/dag.py is on the stack
        frames = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
        stage = "dag" if any(f.endswith(os.path.join("snakemake", "dag.py")) for f in frames) else "workflow"
    except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        os.chdir(cwd)
    return {**result, "stage": stage}


def dry_runs(requests: list[dict], timeout: float = 600) -> dict[str, dict]:
    """Run ``requests`` (module docstring) in one separate process; their results by name."""
    with tempfile.TemporaryDirectory(prefix="stapo-snakemake-batch-") as tmp:
        req, out = Path(tmp) / "requests.json", Path(tmp) / "results.json"
        req.write_text(json.dumps(requests))
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        res = subprocess.run([sys.executable, __file__, str(req), str(out)], env=env, capture_output=True, text=True,
                             timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"snakemake_batch failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
        return json.loads(out.read_text())


def main(argv: list[str]) -> int:
    requests = json.loads(Path(argv[0]).read_text())
    results = {r["name"]: dry_run(r["configfiles"], r["workdir"], r["targets"]) for r in requests}
    Path(argv[1]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
