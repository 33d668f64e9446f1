"""Test power as a number: the mutation score of the unit tests over the loss and micro-batching modules.

mutmut 3.8.1 (configuration: pyproject.toml, [tool.mutmut]) copies stapo/ to mutants/, rewrites every function of
the loss modules (stapo/losses/: registry, masks, policy, related, aggregation) and the micro-batching ones
(stapo/train/partition.py, layout.py; the list: pyproject.toml's only_mutate) into small variants ("mutants": an
operator, a constant, a comparison, a keyword argument changed), and runs the fast unit tests that reach each function
(tests/test_objectives.py, test_related_methods.py, test_batching.py, test_diagnostics.py; not slow, without the
multi-second integration tests) against each mutant. A mutant is killed when a test fails, survives when all pass.
Per module: mutants in total, killed, survived, no tests (no selected test calls the function), timeout/suspicious,
and the score (killed + timeout) / (total − skipped), mutmut's own badge formula; then every survivor (name, diff
from ``mutmut show``). A mutant no test could ever tell apart (an equivalent mutant) survives by construction.

    python benchmarks/mutation.py [--module losses/masks ...] [--json out.json] [--keep]
                                  [--report-only] [--max-children N]
    make mutation [MODULE=train/partition]

Each run starts from an empty mutants/ (mutmut would otherwise keep earlier verdicts) unless --keep.

Measured 2026-12-07 on this 2-core machine (2 mutmut workers), score (killed + timeout) / total, killed/total
(survived). Before and after issue 37's tests, on the modules as they were then (stapo/objectives.py,
related_losses.py, batching.py; another session was using the CPUs too):
                      before issue 37's tests                after
    objectives        80.0 %  595/744 (149)                  97.4 %  725/744 (19)
    related_losses    94.0 %  249/265 (16)                   95.8 %  254/265 (11)
    batching          75.0 %  213/284 (51, and 20 no tests)  96.8 %  275/284 (9)
    full run          5 min 11 s (1,293 mutants)             3 min 42 s; --module batching alone 42 s
The same tests on the modules of issue 38's layout (objectives split into registry, masks, policy and the
aggregation; batching into partition and layout), the machine quiet:
    losses/registry   96.4 %  27/28 (0; 1 no tests: a typing Protocol's stub)
    losses/masks      97.0 %  382/394 (12)
    losses/policy     98.3 %  297/302 (5)
    losses/related    95.8 %  254/265 (11)
    losses/aggregation 97.0 % 65/67 (2)
    train/partition   96.8 %  92/95 (3)
    train/layout      96.7 %  178/184 (6)
    full run          1 min 49 s (1,335 mutants)
Every survivor is equivalent: a dimension ±1 on a 1- or 2-D tensor (unsqueeze(+1), sum(+1)), a device argument
dropped or None (equivalent on the CPU, where every tensor of these tests is), a default restated (topk
largest=True, .to(None)), a comparison that cannot tie (Karmarkar–Karp's state order) or a bound that cannot bind
(k3 ≥ 0 > −kl_clip; an empty step's longest length), ≤ for < at Â = 0 where both sides are −0.0, ±1e-8 below
fp32's resolution, a ratio the step's cut makes unused.
Plain ``mutmut run`` skips decorated functions: this script mutates the registered ones too (:func:`undecorate`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
def _targets() -> tuple[str, ...]:
    """The mutated modules, as paths under stapo/ without .py (``losses/masks``): pyproject.toml's
    [tool.mutmut] only_mutate, the one list (it follows the modules when they move)."""
    import tomllib

    paths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    return tuple(p.removeprefix("stapo/").removesuffix(".py") for p in paths)


MODULES = _targets()
COLUMNS = ("total", "killed", "survived", "no tests", "timeout/suspicious", "score %")


def _is_registrar(decorator) -> bool:
    import libcst as cst

    call = decorator.decorator
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value.startswith("register_")


def undecorate(source: str) -> str:
    """``@register_x(...) def f`` -> ``def f`` then ``f = register_x(...)(f)``: the same function registered at the
    same point of the import, so the same behaviour; mutmut 3.8.1 leaves every decorated function unmutated (the
    four related losses, the token masks, the threshold functions, the vanilla loss), but mutates this form."""
    import libcst as cst

    module, body = cst.parse_module(source), []
    for stmt in module.body:
        decorators = stmt.decorators if isinstance(stmt, cst.FunctionDef) else ()
        if not decorators or not all(_is_registrar(d) for d in decorators):
            body.append(stmt)
            continue
        applied = cst.Name(stmt.name.value)
        for d in reversed(decorators):
            applied = cst.Call(func=d.decorator, args=[cst.Arg(applied)])
        body += [stmt.with_changes(decorators=()),
                 cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(stmt.name.value))], applied)])]
    return module.with_changes(body=body).code


def mutmut_cli(argv: list[str]) -> None:
    """mutmut's command line, generating the mutants of MODULES from their undecorated form (:func:`undecorate`)."""
    import mutmut
    import mutmut.__main__ as mm

    assert mutmut.__version__ == "3.8.1", f"written against mutmut 3.8.1's internals, not {mutmut.__version__}"
    write = mm.write_all_mutants_to_file
    targets = {f"stapo/{m}.py" for m in MODULES}

    def write_undecorated(*, out, source, filename):
        return write(out=out, source=undecorate(source) if str(filename) in targets else source, filename=filename)

    mm.write_all_mutants_to_file = write_undecorated  # the mutant generation pool is forked: it sees this
    mm.cli(argv)


def run_mutmut(modules: list[str], keep: bool, max_children: int | None) -> float:
    """``mutmut run`` over the modules' mutants (all three: every mutant); returns the wall time in seconds."""
    if not keep:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--mutmut", "run"]
    if max_children:
        cmd += ["--max-children", str(max_children)]
    if set(modules) != set(MODULES):
        cmd += [f"stapo.{m.replace('/', '.')}.*" for m in modules]
    env = {**os.environ, "STAPO_VERL_DIR": os.environ.get("STAPO_VERL_DIR", str(Path(sys.prefix) / "peers"))}
    print(f"mutmut run over {', '.join(modules)} (the full run: about 4 min on 2 cores) ...", file=sys.stderr)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"mutmut run failed (exit {proc.returncode})")
    return seconds


def verdicts(module: str) -> dict[str, str]:
    """Mutant name -> mutmut's status (killed, survived, no tests, timeout, ...) from mutants/stapo/<module>.py.meta."""
    from mutmut.stats import status_by_exit_code

    meta = ROOT / "mutants" / "stapo" / f"{module}.py.meta"
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in sorted(codes.items(), key=lambda kv: _natural(kv[0]))}


def _natural(name: str) -> tuple[str, int]:
    stem, _, number = name.rpartition("_")
    return (stem, int(number)) if number.isdigit() else (name, 0)


def summary(status: dict[str, str]) -> dict[str, float]:
    """The table's row for one module."""
    count = {s: sum(v == s for v in status.values()) for s in set(status.values())}
    total, skipped = len(status), count.get("skipped", 0)
    timeout = count.get("timeout", 0)
    detected = count.get("killed", 0) + timeout
    return {"total": total, "killed": count.get("killed", 0), "survived": count.get("survived", 0),
            "no tests": count.get("no tests", 0), "timeout/suspicious": timeout + count.get("suspicious", 0),
            "score %": round(100.0 * detected / max(1, total - skipped), 1)}


def show(name: str) -> str:
    """``mutmut show NAME``'s diff (in this process: one interpreter start, not one per survivor)."""
    from mutmut.__main__ import cli

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            cli.main(["show", name], standalone_mode=False)
    finally:
        os.chdir(cwd)
    return out.getvalue().split("\n", 1)[1].rstrip()  # without mutmut's "# name: status" line


def report(rows: dict[str, dict], survivors: dict[str, dict[str, str]], seconds: float | None) -> str:
    """The table, then every mutant that was not killed (survived or no tests) with its diff."""
    width = max(len(m) for m in rows) + 2
    lines = ["module".ljust(width) + "".join(c.rjust(20) for c in COLUMNS)]
    for module, row in rows.items():
        lines.append(module.ljust(width) + "".join(str(row[c]).rjust(20) for c in COLUMNS))
    if seconds is not None:
        lines.append(f"\nmutmut run: {seconds:.0f} s wall time")
    for module, diffs in survivors.items():
        lines.append(f"\n=== {module}: {len(diffs)} not killed")
        for name, diff in diffs.items():
            lines += [f"\n--- {name}", diff]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--mutmut"]:  # run_mutmut's subprocess
        return mutmut_cli(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", action="append", choices=MODULES, help="one module (repeatable); default all")
    parser.add_argument("--json", type=Path, help="also write the table and the survivors' diffs here")
    parser.add_argument("--keep", action="store_true", help="keep mutants/ and its verdicts (rerun nothing done)")
    parser.add_argument("--report-only", action="store_true", help="no run: report the verdicts in mutants/")
    parser.add_argument("--max-children", type=int, help="mutmut workers (default: the CPU count)")
    args = parser.parse_args(argv)
    modules = args.module or list(MODULES)
    seconds = None if args.report_only else run_mutmut(modules, args.keep, args.max_children)
    rows, survivors = {}, {}
    for module in modules:
        status = verdicts(module)
        rows[module] = summary(status)
        survivors[module] = {n: f"[{s}]\n{show(n)}" for n, s in status.items() if s not in ("killed", "timeout")}
    print(report(rows, survivors, seconds))
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "wall_seconds": seconds, "modules": rows,
                                         "not_killed": survivors}, indent=2) + "\n")


if __name__ == "__main__":
    main()
