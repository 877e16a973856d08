"""The README and docs say what their records say: every generated block equals what its
record renders, every figure row is traceable, and the README stays a guide (length, links,
layout, the commands it names exist, help texts quote no measurement)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import record
from featcache.pipeline import list_recipes, load_recipe, readme_block
from featcache.sections import readme_section

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
#: the user-facing pages whose links are checked
PAGES = ("README.md", "CHANGELOG.md", "docs/performance.md", "docs/pipelines.md",
         "docs/troubleshooting.md")


def test_each_recipe_block_is_rendered_from_its_record():
    published = []
    for path, _ in list_recipes(REPO / "pipelines"):
        recipe = load_recipe(path)
        if not recipe.report.get("readme"):
            continue
        assert recipe.report.get("record"), f"{path}: a [report] readme needs its record"
        document = (path.parent / recipe.report["readme"]).resolve()
        saved = json.loads((path.parent / recipe.report["record"]).read_text(encoding="utf-8"))
        section = readme_section(document.read_text(encoding="utf-8"), recipe.name)
        assert section == readme_block(saved).strip("\n"), (
            f"{document.name}'s {recipe.name} block differs from its record: run `featcache "
            f"pipeline render pipelines/{path.name}` (or `make docs`)")
        published.append(recipe.name)
    assert "real-features" in published


def test_each_record_block_is_rendered_from_the_benchmark_record():
    assert record.stale_blocks(record.read()) == [], "run `python -m benchmarks.record render`"


def test_every_figure_in_the_record_says_where_it_came_from():
    rows = record.read()
    assert rows
    for row in rows:
        where = f"{row['what']} ({row['date']}, {row['device']})"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), where
        assert row["featcache"], where
        assert re.fullmatch(r"[0-9a-f]{7,40}", row["commit"] or row["recorded_in"] or ""), where
        assert row["section"] in record.SECTIONS, where
        assert isinstance(row["value"], (int, float)) and row["unit"], where
        if row["source"]:
            assert (REPO / row["source"]).is_file(), f"{where}: {row['source']} is not in the repository"


def test_record_rows_from_a_benchmark_document_carry_its_provenance(tmp_path, monkeypatch):
    folder = REPO / "docs" / "gpu-runs" / "2026-11-28-h200" / "gpu-check"
    document = json.loads((folder / "bench-extract-448.json").read_text(encoding="utf-8"))
    document["command"] = "python -m benchmarks.extract --device cuda --gpu-decode"
    document["machine"].update(featcache="9.9", commit="abcdef1")
    target = tmp_path / "record.jsonl"
    monkeypatch.setenv(record.RECORD_ENV, str(target))
    assert record.keep(document, folder / "bench-extract-448.json") == 10
    rows = record.read(target)
    assert {(r["featcache"], r["commit"], r["command"], r["device"], r["date"]) for r in rows} == {
        ("9.9", "abcdef1", document["command"], "NVIDIA H200", "2026-11-28")}
    plain = next(r for r in rows if r["what"] == "end to end, plain loop")
    assert plain["value"] == document["figures"]["end to end, baseline"]["images_per_s"]
    assert plain["window"].endswith("queue of 30 drained, paced by consumer")
    assert plain["source"] == "docs/gpu-runs/2026-11-28-h200/gpu-check/bench-extract-448.json"
    # a gpu-check folder: its benchmark documents, and the check's own figures once
    assert record.main(["add", str(folder), "--command", "make gpu-check", "--commit", "1a69886",
                        "--featcache", "0.1.0", "--record", str(target)]) == 0
    added = record.read(target)[len(rows):]
    assert len(added) == 28 and sum(r["benchmark"] == "gpu_check" for r in added) == 1
    # stage two's timing rows of a gpu-check, under the headline names the README shows
    check = json.loads((folder / "gpu-check.json").read_text(encoding="utf-8"))
    check["results"] = [{"name": "benchmark: stage two", "status": "pass", "numbers": {
        "seconds": {"search": 0.9, "command": 3.5, "all_losses": 18.0}}}]
    timing = record.rows_from_document(check, "make gpu-check", None, "1a69886", "0.1.0")
    assert [(r["glance"], r["value"], r["unit"]) for r in timing] == [
        ("stage two, the default an search (8 configurations x 25 epochs)", 0.9, "s"),
        ("stage two, the whole featcache train-linear --loss an command", 3.5, "s"),
        ("stage two, featcache train-linear --loss all", 18.0, "s")]
    monkeypatch.delenv(record.RECORD_ENV)
    assert record.keep(document, folder / "bench-extract-448.json") == 0  # not asked: no row


def test_the_readme_is_a_short_guide():
    assert len(README.splitlines()) <= 400
    for name in ("make demo", "make test", "make features DATASET=voc",
                 "featcache train-linear --dataset voc --loss an-ls",
                 "featcache finetune --dataset voc --loss role --init best",
                 "docs/reliability.md", "docs/performance.md", "CHANGELOG.md"):
        assert name in README, name
    # no lab notebook: no clock times, load averages or commit hashes in the prose
    prose = re.sub(r"<!-- featcache (\w+) ([\w-]+): begin -->.*?<!-- featcache \1 \2: end -->",
                   "", README, flags=re.S)
    assert not re.search(r"\d\d:\d\d UTC|load average|\bload \d|\b[0-9a-f]{7}\b", prose)


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown page's headings."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_user_pages_link_to_what_exists():
    for page in PAGES:
        path = REPO / page
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.exists(), f"{page} links to {target}, which does not exist"
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked.read_text(encoding="utf-8")), (
                    f"{page} links to {target}: no such heading")


def test_the_layout_names_every_part_of_the_package():
    layout = README.split("## Layout", 1)[1].split("\n## ", 1)[0]
    package = REPO / "featcache"
    parts = [p.name + "/" for p in package.iterdir() if (p / "__init__.py").is_file()]
    parts += [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    missing = [part for part in parts if not re.search(rf"(?<![\w.]){re.escape(part)}", layout)]
    assert not missing, f"README's Layout leaves out {missing}"


def test_readme_make_help_and_cli_agree():
    from click import Context

    from featcache.cli import cli

    done = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True,
                          check=True)
    helped = set(re.findall(r"^make ([\w-]+)", done.stdout, re.M))
    mentioned = set(re.findall(r"`make ([\w-]+)", README)) | set(
        re.findall(r"^make ([\w-]+)", README, re.M))
    assert mentioned <= helped, f"the README names make targets without help: {mentioned - helped}"
    assert helped <= mentioned, f"make help names targets the README does not: {helped - mentioned}"
    # help texts describe behaviour: no measured rates, times or devices
    assert not re.search(r"\d+(\.\d+)?\s*(s|min|minutes|seconds|ms|img/s|x)\b|H100|H200",
                         done.stdout), done.stdout
    commands = set(cli.list_commands(Context(cli)))
    code = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.S))
    named = set(re.findall(r"`featcache ([a-z][\w-]+)", README)) | set(
        re.findall(r"^featcache ([a-z][\w-]+)", code, re.M))
    assert named <= commands, f"the README names commands that do not exist: {named - commands}"
    pipeline = cli.get_command(Context(cli), "pipeline")
    assert set(re.findall(r"`featcache pipeline (\w+)", README)) <= set(
        pipeline.list_commands(Context(pipeline)))


@pytest.mark.parametrize("page", sorted(record.DOCUMENTS))
def test_render_rewrites_the_blocks_and_nothing_else(page, tmp_path):
    rows = record.read()
    text = (REPO / page).read_text(encoding="utf-8")
    begin = f"<!-- featcache record {record.DOCUMENTS[page][0]}: begin -->"
    stale = text.replace(begin + "\n", begin + "\n| a row by hand |\n", 1)
    assert stale != text and record.rendered(page, stale, rows) == text
    for name in record.DOCUMENTS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(stale if name == page else
                                     (REPO / name).read_text(encoding="utf-8"), encoding="utf-8")
    assert record.stale_blocks(rows, tmp_path) == [f"{page}: {record.DOCUMENTS[page][0]}"]
