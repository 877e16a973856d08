"""``featcache report``: one self-contained HTML page of a dataset's runs of both stages, checked
against the runs' results.json; it parses, holds no URL, renders in a headless browser."""

from __future__ import annotations

import re
import shlex
import shutil
import statistics
import subprocess
from html.parser import HTMLParser

import pytest
from dataset_fixtures import invoke
from helpers_finetune import NAME, ROLE_ONE_CONFIG, base_cache, shared_run

from featcache.errors import InputError, OutputExistsError
from featcache.protocol.configurations import configurations
from featcache.protocol.runs import load_results
from featcache.report import build_report, write_report
from featcache.report.groups import table_groups
from featcache.report.runs import find_runs

FAST = ("--epochs", "2", "--lr", "1e-2,1e-3", "--bsize", "4", "--quiet", "--no-plots",
        "--device", "cpu")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The toy image set with: a linear ROLE run (linear-role, from the shared base), an and
    an-ls with seeds 0 and 1 (s01), ROLE fine-tuned from its linear run (ft), and a CAM figure
    of the an and the fine-tuned runs. The fine-tuned run is the session's (the same grid from
    the same linear run, trained once: test_finetune_checkpoints and test_faults_interrupt read
    it too), copied in as a moved run folder, without the per-epoch checkpoints it keeps."""
    root = tmp_path_factory.mktemp("report")
    cache = root / "cache"
    shutil.copytree(base_cache(tmp_path_factory.getbasetemp()), cache)
    result = invoke("train-linear", "--dataset", NAME, "--loss", "an,an-ls", "--seeds", "0,1",
                    "--run-id", "s01", "--cache", cache, *FAST)
    assert result.exit_code == 0, result.output
    finetuned = shared_run(tmp_path_factory.getbasetemp(), "all", *ROLE_ONE_CONFIG,
                           "--keep-checkpoints", "all")
    shutil.copytree(finetuned.run_dir, cache / NAME / "finetune" / "role" / "ft",
                    ignore=shutil.ignore_patterns("epoch-*.pt"))
    image = next(p for p in sorted(cache.parent.parent.rglob("*.jpg")) if "cache" not in p.parts)
    result = invoke("cam", "--run", cache / NAME / "runs" / "an" / "s01", "--run",
                    cache / NAME / "finetune" / "role" / "ft", image, "--out",
                    cache / NAME / "cam-test.png", "--device", "cpu")
    assert result.exit_code == 0, result.output
    return cache


@pytest.fixture(scope="module")
def page(cache):
    out = cache / NAME / "report.html"
    result = invoke("report", cache / NAME)
    assert result.exit_code == 0, result.output
    assert f"report -> {out}" in result.output
    return out.read_text(encoding="utf-8")


class Page(HTMLParser):
    """Each element with an id: its text; each element's attributes, in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str | None]] = []
        self.text: dict[str, list[str]] = {}
        self.elements: list[tuple[str, dict, str | None]] = []  # (tag, attrs, enclosing id)
        self.open_ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs, self.open_ids[-1] if self.open_ids else None))
        if tag in ("br", "meta", "img", "hr", "input", "link"):  # HTML's void elements
            return
        self.stack.append((tag, attrs.get("id")))
        if attrs.get("id"):
            self.open_ids.append(attrs["id"])
            self.text[attrs["id"]] = []

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), self.open_ids[-1] if self.open_ids else None))

    def handle_endtag(self, tag):
        while self.stack:
            name, ident = self.stack.pop()
            if ident:
                self.open_ids.remove(ident)
            if name == tag:
                break

    def handle_data(self, data):
        for ident in self.open_ids:
            self.text[ident].append(data)

    def section(self, ident: str) -> str:
        return "".join(self.text[ident])

    def values(self, ident: str) -> list[str]:
        """The ``data-v`` attributes inside the element with id ``ident``."""
        inside = set()
        return [attrs["data-v"] for _, attrs, owner in self.elements
                if "data-v" in attrs and (owner == ident or owner in inside)]


def parse(html: str) -> Page:
    parser = Page()
    parser.feed(html)
    parser.close()
    return parser


def test_the_page_parses_and_holds_every_runs_numbers(cache, page):
    parsed = parse(page)
    runs = find_runs(cache / NAME)
    assert sorted(run.name for run in runs) == ["finetune/role/ft", "runs/an-ls/s01",
                                                "runs/an/s01", "runs/role/linear-role"]
    for run in runs:
        document = load_results(run.path)
        assert run.anchor in parsed.text, run.name
        text = parsed.section(run.anchor)
        selection = document["selection"]
        assert f"test {selection['test_map']:.2f}" in text
        assert f"val {selection['val_map']:.2f}" in text
        assert document["fingerprint"] in text
        assert "featcache " + " ".join(document["command"][1:3]) in text
        # every configuration's val and test mAP at its selected epoch, at full precision
        values = parsed.values(run.anchor)
        for config in configurations(document):
            assert repr(config.test_map) in values and repr(config.val_map) in values
        if run.stage == "linear":
            for seed in document["seeds"]:
                chosen = seed["selected"]
                assert any(c.selected and c.seed == chosen["seed"] and c.lr == chosen["lr"]
                           and c.test_map == chosen["test_map"]
                           for c in configurations(document))


def test_the_loss_tables_hold_mean_and_sd_over_seeds_with_links_to_the_runs(cache, page):
    parsed = parse(page)
    tables = parsed.section("tables")
    for loss in ("an", "an-ls"):
        document = load_results(cache / NAME / "runs" / loss / "s01")
        tests = [s["selected"]["test_map"] for s in document["seeds"]]
        mean, sd = statistics.fmean(tests), statistics.stdev(tests)
        assert f"{mean:.2f} ± {sd:.2f}" in tables
        owners = [attrs.get("data-v") for tag, attrs, _ in parsed.elements if tag == "td"]
        assert repr(mean) in owners and repr(sd) in owners
    # the base run (another grid) has its own table: no cell mixes settings
    groups = table_groups(find_runs(cache / NAME))
    assert [g.stage for g in groups] == ["linear", "linear", "finetune"]
    assert tables.count("Stage two: linear heads") == 2
    assert "Stage three: fine-tuned end to end" in tables
    hrefs = {attrs["href"] for tag, attrs, _ in parsed.elements if tag == "a"}
    for run in find_runs(cache / NAME):
        assert f"#{run.anchor}" in hrefs
    assert 'class="sortable"' in page and "addEventListener" in page


def test_the_page_makes_no_external_request(page):
    # no URL outside the inline images' base64 payloads (whose letters may spell anything)
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert "http" not in text.lower()
    for tag, attrs, _ in parse(page).elements:
        for name in ("src", "href"):
            if name in attrs:
                assert attrs[name].startswith(("#", "data:image/png;base64,")), (tag, attrs)
        assert tag not in ("link", "iframe", "object", "embed")
        assert not (tag == "script" and "src" in attrs)


def test_heatmap_marks_the_classes_a_loss_gains_or_loses_on_an(cache, page):
    """A cell is outlined where the paired per-class interval against an excludes 0."""
    groups = table_groups(find_runs(cache / NAME))
    index = next(i for i, group in enumerate(groups) if "an" in group.table.losses)
    table, paired = groups[index].table, groups[index].uncertainty.cells
    gains = losses = 0
    reference = table.cells[("an", NAME)].per_class()[0]
    for loss in table.losses:
        if loss == "an":
            continue
        assert paired[(loss, NAME)].class_versus, loss  # every run here keeps its test scores
        for name, value in table.cells[(loss, NAME)].per_class()[0].items():
            low, high = paired[(loss, NAME)].class_versus[name]
            delta = value.mean - reference[name].mean
            if low > 0 or high < 0:
                gains, losses = gains + (delta > 0), losses + (delta < 0)
    heatmap = page[page.index(f'id="heatmap-{index}"'):page.index(f'id="heatmap-{index + 1}"')]
    assert heatmap.count('class="cell gain"') == gains
    assert heatmap.count('class="cell loss"') == losses
    assert f"&#9650;{gains}" in heatmap or gains == 0
    assert "outlined green" in heatmap and "excludes 0" in heatmap
    assert "1000 resamples" in heatmap
    # a table without an says there is nothing to compare against
    other = page[page.index(f'id="heatmap-{1 - index}"'):]
    assert "no an run in this table" in other[:other.index("</svg>")]


def test_loss_tables_show_intervals_and_paired_differences_to_an(cache, page):
    """Each loss's 95% interval, and against an its paired difference and share of wins; a
    one-seed table says its intervals show test-set uncertainty only."""
    groups = table_groups(find_runs(cache / NAME))
    for index, group in enumerate(groups):
        section = page[page.index(f'id="table-{index}"'):]
        section = section[:section.index("</table>")]
        assert "95% interval" in section and "percentile bootstrap" in section
        for (loss, _), mine in group.uncertainty.cells.items():
            assert mine.interval is not None, (loss, mine.reason)
            assert f"[{mine.interval.low:.2f}, {mine.interval.high:.2f}]" in section
            if mine.versus is not None:
                assert mine.versus.text() in section and f"{mine.versus.wins:.0%}" in section
        one_seed = all(len(c.seeds) == 1 for c in group.uncertainty.cells.values())
        assert ("test-set uncertainty only" in section) == one_seed


def test_finetuning_sits_beside_its_linear_start(cache, page):
    parsed = parse(page)
    section = parsed.section("finetune")
    document = load_results(cache / NAME / "finetune" / "role" / "ft")
    start = load_results(cache / NAME / "runs" / "role" / "linear-role")
    assert f"{document['selection']['test_map']:.2f}" in section
    assert f"{start['selection']['test_map']:.2f}" in section
    assert "runs/role/linear-role" in section
    assert section.count("linear start: runs/role/linear-role") == 1


def test_cam_figures_are_embedded(page):
    parsed = parse(page)
    images = [attrs for tag, attrs, _ in parsed.elements if tag == "img"]
    assert len(images) == 1 and images[0]["src"].startswith("data:image/png;base64,")
    assert "cam-test.png" in parsed.section("cam")
    assert "an, linear" in parsed.section("cam")


def test_cam_constant_is_the_same_on_both_sides():
    from featcache.api.cam import CAM_RUNS as runs_written
    from featcache.api.cam import CAM_SOFTWARE as written
    from featcache.report.runs import CAM_RUNS as runs_read
    from featcache.report.runs import CAM_SOFTWARE as read

    assert written == read and runs_written == runs_read


def test_runs_subset_title_and_out(cache, tmp_path):
    out = tmp_path / "sub.html"
    result = invoke("report", cache / NAME, "--runs", "s01", "--title", "Only s01", "--out", out)
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")
    parsed = parse(html)
    assert "<title>Only s01</title>" in html
    anchors = [i for i in parsed.text if i.startswith("run-")]
    assert sorted(anchors) == ["run-runs--an--s01", "run-runs--an-ls--s01"]
    assert 'id="finetune"' not in html
    # patterns, comma lists and <stage folder>/<loss>/<id>
    html = build_report(cache / NAME, ["finetune/role/*", "an/s01"])
    assert sorted(i for i in parse(html).text if i.startswith("run-")) == [
        "run-finetune--role--ft", "run-runs--an--s01"]
    # a report it wrote is replaced (issue 45, item 7); any other file only with --overwrite
    result = invoke("report", cache / NAME, "--runs", "s01,ft", "--out", out)
    assert result.exit_code == 0 and "replacing the report written there before" in result.output
    assert 'id="finetune"' in out.read_text(encoding="utf-8")
    write_report(cache / NAME, out, ["s01"])
    mine = tmp_path / "mine.html"
    mine.write_text("<!DOCTYPE html><title>my notes</title>", encoding="utf-8")
    result = invoke("report", cache / NAME, "--runs", "s01", "--out", mine)
    assert result.exit_code != 0 and "--overwrite" in result.output
    with pytest.raises(OutputExistsError):
        write_report(cache / NAME, mine, ["s01"])
    assert mine.read_text(encoding="utf-8") == "<!DOCTYPE html><title>my notes</title>"
    assert invoke("report", cache / NAME, "--runs", "s01,ft", "--out", mine,
                  "--overwrite").exit_code == 0


def test_bad_input_is_one_clear_error(cache, tmp_path):
    with pytest.raises(InputError, match="--runs 'nope' matches no finished run; run ids here: "
                                         "ft, linear-role, s01"):
        build_report(cache / NAME, ["nope"])
    with pytest.raises(InputError, match="is not a dataset folder"):
        build_report(tmp_path / "missing")
    # a dataset without runs: the command it suggests trains one, pasted as printed
    (tmp_path / NAME).mkdir()
    for name in ("labels.h5", "features-resnet50-random.h5"):
        shutil.copy(cache / NAME / name, tmp_path / NAME / name)
    result = invoke("report", tmp_path / NAME)
    assert result.exit_code != 0
    assert "holds no finished run" in result.output
    suggested = result.output.split("train one with `")[1].split("`")[0]
    assert suggested == f"featcache train-linear --dataset {NAME} --cache {tmp_path}"
    assert invoke(*shlex.split(suggested)[1:]).exit_code == 0
    assert invoke("report", tmp_path / NAME).exit_code == 0


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.slow
def test_the_page_renders_in_a_headless_browser(page, cache, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no headless browser installed (apt-get install chromium to run this check)")
    shot = tmp_path / "page.png"
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", "--window-size=1280,1600", f"--screenshot={shot}",
                    (cache / NAME / "report.html").resolve().as_uri()],
                   check=True, capture_output=True, timeout=180)
    from PIL import Image

    with Image.open(shot) as image:
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20)
        width, height = pixels.size
    assert (width, height) == (1280, 1600)
    not_white = sum(count for count, rgb in colours if rgb != (255, 255, 255))
    assert not_white > 0.02 * width * height  # text, tables and figures, not a blank page
    assert len(colours) > 50  # the heatmap's and the curves' colours, anti-aliased text


def test_a_moved_cache_still_finds_the_linear_start(cache, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(cache / NAME, moved, ignore=shutil.ignore_patterns("*.h5", "*.pt"))
    section = parse(build_report(moved)).section("finetune")
    assert section.count("linear start: runs/role/linear-role") == 1


@pytest.mark.slow
def test_a_dataset_with_a_zero_shot_run_is_reported_with_dashes(tmp_path, cache_dir):
    """Issue 36, item 9: `report` crashed on a folder holding CLIP's zero-shot row (no lr,
    batch or epoch). The real commands on CLIP's tiny random test tower (clip-vit-b16 takes
    minutes of CPU for the same path)."""
    from faults import run

    for args in (("prepare", "shapes", "--num-train", "20", "--num-test", "10"),
                 ("features", "--dataset", "shapes", "--backbone", "test-clip", "--weights",
                  "random", "--text", "--image-size", "32", "--device", "cpu", "--workers", "0"),
                 ("train-linear", "--dataset", "shapes", "--loss", "an,zero-shot", "--epochs", "1",
                  "--lr", "1e-2", "--bsize", "8", "--run-id", "z", "--quiet", "--no-plots",
                  "--device", "cpu")):
        made = invoke(*args)
        assert made.exit_code == 0, made.output
    assert (cache_dir / "shapes" / "runs" / "zero-shot" / "z" / "results.json").is_file()
    reported = run(["report", str(cache_dir / "shapes")], cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    html = (cache_dir / "shapes" / "report.html").read_text(encoding="utf-8")
    card = html[html.index('id="run-runs--zero-shot--z"'):]
    card = card[:card.index("</article>")]
    assert "(lr -, batch -, epoch -)" in card and "configurations (each" not in card
    table = invoke("table", cache_dir / "shapes" / "runs" / "zero-shot" / "z")
    assert re.search(r"\| zero-shot \| shapes +\| +0 \| - +\|", table.output), table.output


def test_runs_leaves_out_the_cam_figures_of_the_runs_it_leaves_out(cache, tmp_path):
    """Issue 36, item 14: `--runs s01` still showed the figure of the fine-tuned run ft."""
    html = build_report(cache / NAME, ["s01"])
    assert 'id="cam"' not in html and "cam-test.png" not in html
    shown = build_report(cache / NAME, ["s01", "ft"])  # every run of the figure chosen
    assert "cam-test.png" in parse(shown).section("cam")


def test_the_runs_of_an_older_cam_figure_are_read_from_its_row_labels():
    from featcache.report.runs import _figure_runs

    text = {"Description": "an, linear\ns01, test mAP 61.2; role, fine-tuned\nft, test mAP 70.0"}
    assert _figure_runs(text) == ["runs/an/s01", "finetune/role/ft"]
    assert _figure_runs({"Description": "my own label"}) is None
    assert _figure_runs({"featcache runs": '["runs/an/a"]'}) == ["runs/an/a"]


def test_spatial_runs_are_captioned_as_maps_and_advised_what_can_run(cache_dir, tmp_path):
    """Issue 36, item 14: IGNORE's table said "24-d toy features" for 2x2x6 maps, and its
    heatmap advised `train-linear --loss an`, which cannot train on the spatial file."""
    from faults import run
    from linear_fixtures import spatial_features_file, synthetic_dataset

    labels_path, _ = synthetic_dataset(cache_dir)
    spatial_features_file(labels_path)
    trained = run(["train-linear", "--dataset", "toy", "--loss", "an-ls,ignore", "--param",
                   "warm_up=1", "--run-id", "r", "--epochs", "2", "--lr", "1e-2", "--bsize", "16",
                   "--quiet", "--no-plots", "--device", "cpu"], cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    html = build_report(cache_dir / "toy")
    assert "toy: 2x2x6 toy feature maps" in html and "24-d" not in html
    assert ("no an run in this table: its losses train on feature maps (a spatial features "
            "file), which an does not; compare them with an in the table of the pooled "
            "features") in html
    advised = re.search(r"no an run in this table: nothing to compare against \(run <code>"
                        r"([^<]+)</code>", html).group(1)
    import html as html_module

    command = html_module.unescape(advised)
    assert command == ("featcache train-linear --loss an --dataset toy --run-id r --epochs 2 "
                       "--lr 1e-2 --bsize 16 --quiet --no-plots --device cpu")
    pasted = run(shlex.split(command)[1:], cwd=tmp_path)  # works as printed
    assert pasted.returncode == 0, pasted.stderr
    again = build_report(cache_dir / "toy")
    assert "nothing to compare against" not in again and "feature maps (a spatial" in again


@pytest.mark.slow
def test_the_fine_tuning_heatmap_advises_a_command_that_joins_its_table(cache, tmp_path):
    """Issue 36, item 14: the advice `featcache finetune --loss an` "with the same settings"
    could not be pasted; it now spells the settings (a fresh head: an has no LinearInit)."""
    import html as html_module

    copy = tmp_path / "cache"
    shutil.copytree(cache / NAME, copy / NAME, ignore=shutil.ignore_patterns("*.png"))
    html = build_report(copy / NAME, ["ft"])
    advised = html_module.unescape(re.search(
        r"no an run in this table: nothing to compare against \(run <code>([^<]+)</code>",
        html).group(1))
    assert advised == (f"featcache finetune --dataset {NAME} --loss an --init none --backbone "
                       "resnet50 --weights random --image-size 32 --lr 0.001 --bsize 4 --epochs "
                       f"2 --head-lr-mult 1 --val clean --seed 0 --precision fp32 --run-id ft "
                       f"--cache {copy}")
    pasted = invoke(*shlex.split(advised)[1:], "--quiet", "--no-plots", "--device", "cpu")
    assert pasted.exit_code == 0, pasted.output
    again = build_report(copy / NAME, ["ft"])
    assert "nothing to compare against" not in again  # an joined the fine-tuning table
