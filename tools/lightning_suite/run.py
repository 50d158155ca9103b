"""Run Lightning's own tests (tests/tests_pytorch of the tag matching the installed pytorch-lightning) first under
real Lightning, then against Tandem through a names-only alias package, and write the comparison table into
docs/porting.md ("Lightning's own tests"). Not part of `make test`: Lightning's tests never enter this repository.

    python tools/lightning_suite/run.py                    # everything (make lightning-suite)
    python tools/lightning_suite/run.py --files loops/test_training_loop.py --no-doc
    python tools/lightning_suite/run.py --reuse-lightning  # rerun only the Tandem side

The checkout comes from --tests (a directory holding tests/tests_pytorch) or is extracted from a bare clone of
Lightning-AI/pytorch-lightning given by --mirror (or LIGHTNING_MIRROR) with `git archive <tag> tests/tests_pytorch`.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import fnmatch
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from importlib.metadata import version

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_MIRROR = "/work/.mirror/Lightning-AI+pytorch-lightning/repo"
# Every file of tests/tests_pytorch, except these: what cannot run on this machine (issue 43). docs/porting.md
# ("Lightning's own tests") names each with its reason; tests/test_lightning_suite_alias.py keeps the two in step.
EXCLUDED = {
    "accelerators/test_gpu.py": "CUDA GPUs",
    "accelerators/test_mps.py": "Apple MPS",
    "accelerators/test_xla.py": "XLA (TPU)",
    "models/test_gpu.py": "CUDA GPUs",
    "models/test_ddp_fork_amp.py": "CUDA GPUs (every test needs one)",
    "models/test_tpu.py": "TPUs",
    "models/test_torch_tensorrt.py": "TensorRT (CUDA)",
    "graveyard/test_*.py": "the graveyard: Lightning's removed HPU/TPU/precision shims",
    "checkpointing/test_legacy_checkpoints.py": "the legacy checkpoints (a download)",
    "loggers/test_comet.py": "a hosted service (Comet)",
    "loggers/test_litlogger.py": "a hosted service (Lightning's litlogger)",
    "plugins/precision/test_bitsandbytes.py": "bitsandbytes (CUDA)",
    "plugins/precision/test_deepspeed_precision.py": "DeepSpeed",
    "plugins/precision/test_transformer_engine.py": "Transformer Engine (CUDA)",
    "plugins/precision/test_xla.py": "XLA (TPU)",
    "profilers/test_xla_profiler.py": "XLA (TPU)",
    "strategies/test_deepspeed.py": "DeepSpeed",
    "strategies/test_xla.py": "XLA (TPU)",
    "utilities/test_deepspeed_collate_checkpoint.py": "DeepSpeed",
    "utilities/test_deepspeed_model_summary.py": "DeepSpeed",
}
FILES = ["**/test_*.py"]
BEGIN, END = "<!-- lightning-suite:begin -->", "<!-- lightning-suite:end -->"
OPEN = "\n### Open\n"


def excluded(rel: str) -> str | None:
    """The reason a file (relative to tests_pytorch) is left out of the run, or None."""
    return next((why for pat, why in EXCLUDED.items() if fnmatch.fnmatch(rel, pat)), None)


def select(base: str, patterns: list[str] | None) -> list[str]:
    """The test files to run, as paths relative to tests/ (`tests_pytorch/...`). Files named explicitly run even
    when EXCLUDED leaves them out of the whole run."""
    found = {os.path.relpath(f, base) for pat in (patterns or FILES)
             for f in glob.glob(os.path.join(base, pat), recursive=True)}  # fmt: skip
    keep = found if patterns else {f for f in found if excluded(f) is None}
    return sorted(os.path.join("tests_pytorch", f) for f in keep)


def checkout(args: argparse.Namespace) -> tuple[str, str]:
    """(directory holding tests/tests_pytorch, the tag used)."""
    wanted = version("pytorch_lightning")
    if args.tests:
        return os.path.abspath(args.tests), args.tag or wanted
    mirror = args.mirror or os.environ.get("LIGHTNING_MIRROR", DEFAULT_MIRROR)
    tags = subprocess.run(
        ["git", "--git-dir", mirror, "tag"], capture_output=True, text=True, check=True
    ).stdout.split()
    tag = args.tag or wanted
    if tag not in tags:  # the nearest release at or below the installed version

        def key(t: str) -> tuple[int, ...]:
            return tuple(int(p) for p in t.split("."))

        releases = [t for t in tags if t.replace(".", "").isdigit() and t.count(".") == 2]
        below = [t for t in releases if key(t) <= key(tag)]
        tag = max(below, key=key)
        print(
            f"tag {args.tag or wanted} is not in {mirror}; using the nearest release {tag}", file=sys.stderr
        )
    dest = os.path.join(ROOT, "build", "lightning_suite", f"tests-{tag}")
    if not os.path.isdir(os.path.join(dest, "tests", "tests_pytorch")):
        os.makedirs(dest, exist_ok=True)
        archive = subprocess.run(
            ["git", "--git-dir", mirror, "archive", tag, "tests/tests_pytorch"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    with open(
        os.path.join(dest, "tests", "pytest.ini"), "w"
    ) as f:  # the rootdir: no project's config applies
        f.write("[pytest]\n")
    return dest, tag


FILE_TIMEOUT_S = 1800  # one file's pytest process at most


def run_pytest(
    mode: str,
    tests_dir: str,
    files: list[str],
    out: str,
    timeout: int,
    root: str = ROOT,
    resume: bool = False,
    jobs: int = 2,
    budget_s: float | None = None,
) -> float:
    """Each file in its own pytest process (a test that kills its process loses only its file), `jobs` at once;
    with `resume`, files that already have results in `out` are skipped; past `budget_s` seconds no further file
    starts (the run is continued later with `resume`)."""
    done = {row["file"] for row in load(out).values()} if resume else set()
    if not resume and os.path.exists(out):
        os.remove(out)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "plugin", "-o", "addopts=",
           "--continue-on-collection-errors"]  # fmt: skip
    if mode == "tandem":
        cmd += ["--noconftest", "-p", "shims"]
    env = dict(os.environ, LIGHTNING_SUITE_MODE=mode, LIGHTNING_SUITE_TIMEOUT=str(timeout))
    # site/: the alias in every process a test starts (sitecustomize.py)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "site"), HERE, root, os.path.join(tests_dir, "tests")]
    )
    env.setdefault("PL_DISABLE_FORK", "1")
    start = time.time()

    def one(f: str) -> None:
        if budget_s is not None and time.time() - start > budget_s:
            return
        part = f"{out}.{f.replace('/', '_')}.part"
        if os.path.exists(part):
            os.remove(part)
        proc = subprocess.Popen(cmd + [f], cwd=os.path.join(tests_dir, "tests"), start_new_session=True,
                                env=dict(env, LIGHTNING_SUITE_OUT=part), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            proc.wait(timeout=FILE_TIMEOUT_S)
        except (
            subprocess.TimeoutExpired
        ):  # the tests that finished keep their rows; the rest count as not run
            print(f"  {mode}: {f} past {FILE_TIMEOUT_S} s: stopped", flush=True)
        finally:  # the file's process group: the workers a test spawned go with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with open(out, "a") as dst:
            if os.path.exists(part):
                dst.write(open(part).read())
                os.remove(part)
        print(f"  {mode}: {f}", flush=True)

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, [f for f in files if f not in done]))
    return time.time() - start


def load(path: str) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    if os.path.exists(path):
        for line in open(path):
            row = json.loads(line)
            rows[row["nodeid"]] = row
    return rows


CLASSES = ("internal", "mocked", "behaviour")


def table(
    lightning: dict[str, dict], tandem: dict[str, dict], tag: str, files: list[str], documented: str = ""
) -> tuple[str, dict[str, int]]:
    """The Markdown table; `documented`: docs/porting.md's text outside the table, where a behaviour failure's
    test name counts it as a documented deliberate difference."""
    per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    themes: collections.Counter = collections.Counter()
    mocked: list[str] = []
    broken = {r["file"]: r for r in tandem.values() if r["outcome"] == "collect_error"}
    for nodeid, row in lightning.items():
        if row["outcome"] != "passed" or row["file"] not in files:
            continue
        f = row["file"]
        c = per_file[f]
        c["lightning"] += 1
        t = tandem.get(nodeid) or broken.get(f)
        if t is None:
            t = {
                "outcome": "failed",
                "class": "behaviour",
                "reason": "not run under Tandem (deselected or crashed)",
            }
        if t["outcome"] == "passed":
            c["tandem"] += 1
            c["relaxed"] += bool(t.get("relaxed"))
        elif t["outcome"] == "skipped":
            c["skipped"] += 1
        else:
            c[t["class"]] += 1
            reasons[f][f"{t['class']}: {t['reason']}"] += 1
            if t["class"] == "behaviour":
                themes[t["reason"]] += 1
                c["documented"] += _named(nodeid, documented)
            elif t["class"] == "mocked":
                mocked.append(f"- `{nodeid.removeprefix('tests_pytorch/')}`: {t['reason']}")
    total: collections.Counter = collections.Counter()
    lines = [
        f"Lightning {tag}'s tests/tests_pytorch, counted over the tests that pass under real Lightning here. "
        "*Tandem*: passing against Tandem through the names-only alias (of which *relaxed*: only the words of a "
        "`pytest.raises(match=...)` or `pytest.warns(match=...)` differ, the class and moment are Lightning's; a "
        "generic hint (`PossibleUserWarning`) or a warning of torch's own package never stands in for another). "
        "*internal*: the test reads or patches a Lightning private (an underscored name, an object of Lightning's "
        "private loop, progress, fetcher, connector or result classes, a module Lightning does not export); "
        "*mocked*: it checks a public result behind a mock of a Lightning internal that is not private by name "
        "(listed below the table); *behaviour*: a public name, attribute or result differs (of which *documented*: the "
        "test is named in this page as a deliberate difference). *skipped*: skipped "
        "under Tandem (a hardware or optional-package condition). Regenerate: `make lightning-suite`.",
        "",
        "| file | Lightning | Tandem | relaxed | internal | mocked | behaviour | documented | skipped | main reasons |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for f in sorted(per_file):
        c = per_file[f]
        total.update(c)
        top = _md("; ".join(f"{r} ({n})" for r, n in reasons[f].most_common(3)))
        lines.append(
            f"| {f.removeprefix('tests_pytorch/')} | {c['lightning']} | {c['tandem']} | {c['relaxed']} "
            f"| {c['internal']} | {c['mocked']} | {c['behaviour']} | {c['documented']} | {c['skipped']} | {top[:300]} |"
        )
    lines.append(
        f"| **total ({len(per_file)} files)** | **{total['lightning']}** | **{total['tandem']}** | "
        f"**{total['relaxed']}** | **{total['internal']}** | **{total['mocked']}** | **{total['behaviour']}** | "
        f"**{total['documented']}** | **{total['skipped']}** | |"
    )
    lines += [
        "",
        f"Totals over {len(per_file)} files: {total['lightning']} tests pass under Lightning; {total['tandem']} pass "
        f"against Tandem ({total['relaxed']} relaxed); {total['behaviour']} public-behaviour failures, of which "
        f"{total['documented']} are documented deliberate differences (named in this page outside the table) and "
        f"{total['behaviour'] - total['documented']} are not; {total['internal']} internal only; {total['mocked']} "
        f"mocked; {total['skipped']} skipped.",
    ]
    lines += ["", "Most frequent public-behaviour failures:", ""]
    lines += [_md(f"- {n} x {r}") for r, n in themes.most_common(15)]
    lines += ["", f"A public result behind a mock of a Lightning internal ({len(mocked)}):", ""]
    lines += [_md(m)[:300] for m in sorted(mocked)]
    lines += ["", "Files left out (they cannot run on this machine):", ""]
    lines += [f"- `{pat}`: {why}" for pat, why in EXCLUDED.items()]
    return "\n".join(lines), dict(total)


def outside_table(doc: str) -> str:
    """docs/porting.md's text without the generated table and without its "### Open" section (a test named there
    is a known failure, not a documented deliberate difference)."""
    text = open(doc).read() if os.path.exists(doc) else ""
    if BEGIN in text:
        text = text.split(BEGIN, 1)[0] + text.split(END, 1)[-1]
    if OPEN in text:
        head, rest = text.split(OPEN, 1)
        text = head + ("\n### " + rest.split("\n### ", 1)[1] if "\n### " in rest else "")
    return text


def _named(nodeid: str, text: str) -> bool:
    """Whether the test (its function name, without parameters) is named in `text` as a whole name (the name of
    `test_x` inside `test_x_y` does not count), or by a pattern such as `test_x*`."""
    name, _, param = nodeid.split("::")[-1].partition("[")
    for m in re.finditer(rf"(?<![\w]){re.escape(name)}(?![\w*]|\.py)(\[([^\]`]*)\])?", text):
        if m.group(1) is None or fnmatch.fnmatchcase(param.rstrip("]"), m.group(2)):
            return True  # named alone (every case), or with this case's parameters (`test_x[False-*]`)
    if re.search(rf"(?<![\w]){re.escape(name)}\[", text):
        return False
    # a pattern naming several tests at once: `test_restart*_parity`
    return any(
        fnmatch.fnmatchcase(name, p) for p in re.findall(r"(?<![\w])(test_\w+\*[\w*]*)(?![\w*]|\.py)", text)
    )


def undocumented(
    lightning: dict[str, dict], tandem: dict[str, dict], files: list[str], doc: str
) -> list[str]:
    """The public-behaviour failures whose test docs/porting.md does not name outside the generated table (each
    must be fixed or be a documented deliberate difference)."""
    text = outside_table(doc)
    return [
        nodeid
        for nodeid, row in sorted(lightning.items())
        if row["outcome"] == "passed"
        and row["file"] in files
        and tandem.get(nodeid, {}).get("class") == "behaviour"
        and not _named(nodeid, text)
    ]


def _md(text: str) -> str:
    """A failure's words as Markdown table text: `|` and brackets escaped (`x["a"]["b"]` is no reference link)."""
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]")


def write_doc(doc: str, body: str) -> None:
    text = open(doc).read()
    block = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Lightning's own tests\n\n" + block + "\n"
    open(doc, "w").write(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tests", help="a directory holding tests/tests_pytorch (else extracted from --mirror)")
    p.add_argument(
        "--mirror", help=f"bare git clone of Lightning-AI/pytorch-lightning (default {DEFAULT_MIRROR})"
    )
    p.add_argument("--tag", help="Lightning tag (default: the installed pytorch_lightning version)")
    p.add_argument(
        "--files", nargs="*", help="test files relative to tests/tests_pytorch (default: issue 36's set)"
    )
    p.add_argument("--reuse-lightning", action="store_true", help="keep the last real-Lightning results")
    p.add_argument("--lightning-only", action="store_true", help="run only the real-Lightning side")
    p.add_argument("--tandem-root", default=ROOT, help="the Tandem tree to test (default: this checkout)")
    p.add_argument(
        "--tandem-out", default="tandem.jsonl", help="results file of the Tandem side (under build/)"
    )
    p.add_argument("--resume", action="store_true", help="skip files that already have results")
    p.add_argument(
        "--budget-s", type=float, help="start no further file after this many seconds (with --resume)"
    )
    p.add_argument("--jobs", type=int, default=2, help="pytest processes at once (one file each)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: the table of the files that have results on both sides")  # fmt: skip
    p.add_argument("--timeout", type=int, default=90, help="seconds per test")
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "porting.md"))
    p.add_argument("--no-doc", action="store_true", help="print the table only")
    args = p.parse_args(argv)
    tests_dir, tag = checkout(args)
    base = os.path.join(tests_dir, "tests", "tests_pytorch")
    files = select(base, args.files)
    results = os.path.join(ROOT, "build", "lightning_suite")
    os.makedirs(results, exist_ok=True)
    l_out, t_out = os.path.join(results, "lightning.jsonl"), os.path.join(results, args.tandem_out)
    if args.report_only:
        ran = {r["file"] for r in load(l_out).values()} & {r["file"] for r in load(t_out).values()}
        missing = [f for f in files if f not in ran]
        files = [f for f in files if f in ran]
        if missing:
            print(f"{len(missing)} selected files have no results yet (--resume runs them): {missing}")
        return report(l_out, t_out, tag, files, args, missing)
    if not args.reuse_lightning:
        print(
            f"real Lightning: {len(files)} files ... {run_pytest('lightning', tests_dir, files, l_out, args.timeout, ROOT, args.resume, args.jobs, args.budget_s):.0f}s"
        )
    if args.lightning_only:
        return 0
    print(
        f"Tandem: {len(files)} files ... {run_pytest('tandem', tests_dir, files, t_out, args.timeout, args.tandem_root, args.resume, args.jobs, args.budget_s):.0f}s"
    )
    return report(l_out, t_out, tag, files, args)


def report(
    l_out: str, t_out: str, tag: str, files: list[str], args: argparse.Namespace, pending: list[str] = ()
) -> int:
    lightning, tandem = load(l_out), load(t_out)
    body, total = table(lightning, tandem, tag, files, outside_table(args.doc))
    if pending:  # --report-only over part of the selection: the table says which files it leaves out
        names = ", ".join(f"`{f.removeprefix('tests_pytorch/')}`" for f in pending)
        body += f"\n\nNot yet run against this Tandem code ({len(pending)} selected files, not in the table): {names}."
    print(body)
    if not args.no_doc:
        write_doc(args.doc, body)
    missing = undocumented(lightning, tandem, files, args.doc)
    if missing:
        print(f"{len(missing)} public-behaviour failures not named in {args.doc}:", *missing, sep="\n  ")
    print(json.dumps(total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
