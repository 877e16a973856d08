"""Every ``--out`` is checked before any work: one line naming the option, never a traceback,
never a file replaced without --overwrite, never an input overwritten (issue 25, item 23)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from featcache.cli import cli


def _refused(args, *expected: str) -> str:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)  # a traceback fails the test
    assert result.exit_code != 0
    for text in expected:
        assert text in result.output, result.output
    return result.output


def test_table_out_is_a_folder(tmp_path):
    _refused(["table", str(tmp_path / "runs"), "--out", str(tmp_path)], "--out", "is a folder")


def test_table_out_of_another_format(tmp_path):
    _refused(["table", str(tmp_path / "runs"), "--format", "latex", "--out",
              str(tmp_path / "t.md")], "--out", "ends in '.md'", ".tex")


def test_out_empty_and_under_a_file(tmp_path):
    _refused(["table", str(tmp_path), "--out", ""], "--out is empty")
    blocker = tmp_path / "file.txt"
    blocker.write_text("keep")
    _refused(["table", str(tmp_path), "--out", str(blocker / "t.md")], "is a file, not a folder")
    assert blocker.read_text() == "keep"


def test_predict_refuses_its_own_input_and_an_existing_file_before_any_work(tmp_path):
    features = tmp_path / "x.csv"
    features.write_text("keep")
    _refused(["predict", "--run", str(tmp_path / "no-run"), "--features", str(features), "--out",
              str(features), "--overwrite"], "--out", "is also an input")
    assert features.read_text() == "keep"
    existing = tmp_path / "p.csv"
    existing.write_text("keep")
    # refused before the (missing) run is even loaded: no work is lost at the end
    _refused(["predict", "--run", str(tmp_path / "no-run"), "--features", str(features), "--out",
              str(existing)], "already exists", "--overwrite")
    _refused(["predict", "--run", str(tmp_path / "no-run"), "--features", str(features),
              "--format", "jsonl", "--out", str(tmp_path / "p.csv")], "ends in '.csv'", ".jsonl")


@pytest.mark.parametrize("name, expected", [("cam.jpg", "ends in '.jpg'"), ("cam", "no suffix")])
def test_cam_out_must_be_a_png(tmp_path, name, expected):
    image = tmp_path / "img.jpg"
    image.write_bytes(b"not used")
    _refused(["cam", "--run", str(tmp_path / "run"), str(image), "--out", str(tmp_path / name)],
             "--out", expected, ".png")


def test_report_out_must_be_html_and_new(tmp_path):
    _refused(["report", str(tmp_path), "--out", str(tmp_path / "r.txt")], "--out", ".html")
    (tmp_path / "report.html").write_text("keep")
    _refused(["report", str(tmp_path)], "already exists", "--overwrite")
    assert (tmp_path / "report.html").read_text() == "keep"
