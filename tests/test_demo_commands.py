"""``make demo``: its commands honour $FEATCACHE_CACHE, its last line names files with their
folder, and every command its steps suggest works when pasted (issue 25, items 3 and 11)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from dataset_fixtures import invoke

REPO = Path(__file__).resolve().parents[1]


def demo_recipe(cache: Path, *assignments: str) -> list[str]:
    """The demo's lines as make would run them (``make -n``), featcache called ``featcache``."""
    # Under ``make test`` the inherited MAKEFLAGS/MAKELEVEL make a nested make print
    # "Entering directory" lines; the recipe is read as a top-level make would print it.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "demo",
                           "FEATCACHE=featcache", f"FEATCACHE_CACHE={cache}", *assignments],
                          cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if line.strip()]


def featcache_words(line: str) -> list[str]:
    """The arguments of the featcache command on a recipe line (after ``test ... ||``)."""
    words = shlex.split(line.split("||")[-1])
    assert words[0] == "featcache", line
    return words[1:]


def test_every_demo_path_is_under_featcache_cache_and_the_last_line_names_folders(tmp_path):
    cache = tmp_path / "elsewhere"
    lines = demo_recipe(cache)
    assert not any(" cache/" in line or "cache/shapes" in line.replace(str(cache), "")
                   for line in lines), lines
    paths = [w for line in lines[:-1] for w in shlex.split(line.split("||")[-1])
             if "/" in w and not w.startswith("-")]
    assert paths and all(p == f"{cache}/shapes" or p.startswith(f"{cache}/shapes/")
                         for p in paths), paths
    assert lines[0].startswith(f"test -f {cache}/shapes/labels.h5 ||")
    last = lines[-1]
    assert last.startswith("echo ") and "demo finished" in last
    named = re.findall(r"(\S+\.(?:md|tex|csv|png))", last)
    assert len(named) == 5 and all(n.startswith(f"{cache}/shapes/") for n in named), named


@pytest.mark.slow  # runs every command the demo prints
def test_every_command_the_demo_suggests_works_as_printed(tmp_path, cache_dir):
    """The demo's stage-one and stage-two lines on a small shapes set; then each command their
    output suggests (the skipped BoostLU losses': the demo's --weights random and --image-size
    kept) is run as printed, and the skipped losses train."""
    lines = demo_recipe(cache_dir)
    steps = [featcache_words(line) for line in lines if "featcache " in line
             and featcache_words(line)[0] in ("prepare", "features", "train-linear")]
    assert [s[0] for s in steps] == ["prepare", "features", "train-linear"]
    extra = {"prepare": ["--num-train", "40", "--num-test", "20"],
             "features": ["--device", "cpu"],
             "train-linear": ["--lr", "1e-2", "--bsize", "16", "--device", "cpu"]}
    printed = []
    for words in steps:
        if "--epochs" in words:  # the demo's DEMO_EPOCHS, one here
            words[words.index("--epochs") + 1] = "1"
        result = invoke(*words, *extra[words[0]])
        assert result.exit_code == 0, result.output
        printed.append(result.output)
    suggestions = sorted({c for text in printed for c in re.findall(r"`(featcache [^`]+)`", text)})
    boostlu = [c for c in suggestions if "--spatial" in c]
    assert boostlu and all("--weights random" in c and "--image-size 96" in c for c in boostlu)
    for command in suggestions:
        device = ["--device", "cpu"] if command.startswith("featcache features") else []
        result = invoke(*shlex.split(command)[1:], *device)
        if command.startswith("featcache pseudo-label"):
            # pseudo-labels need a vision-language features file first: one clear error that
            # names the command making it
            assert result.exit_code == 1
            assert re.search(r"`featcache features --dataset shapes --backbone clip-\S+ [^`]*--text",
                             result.output), result.output
        elif "--backbone clip-" in command:
            # that command, which the hint says needs the network once: CLIP's weights are
            # not on an offline machine, and one line says where to put them
            assert result.exit_code == 1 and "the first run needs the network" in "".join(printed)
            assert "are not on this machine" in result.output, result.output
        else:
            assert result.exit_code == 0, (command, result.output)
    again = invoke("train-linear", "--dataset", "shapes", "--backbone", "resnet50-random",
                   "--loss", "an+boostlu", *extra["train-linear"])
    assert again.exit_code == 0, again.output
