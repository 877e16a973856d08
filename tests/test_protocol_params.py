"""Every run records every loss parameter it used (defaults included), once, and stage three
takes them from the linear run it starts from."""

from __future__ import annotations

import json

import pytest
from dataset_fixtures import invoke
from helpers_finetune import NAME, copy_cache, finetune, linear_run
from linear_fixtures import synthetic_dataset

from featcache.losses import loss_class
from featcache.protocol.handoff import load_head
from featcache.protocol.records import selected_params
from featcache.protocol.runs import load_results

FAST = ("--epochs", "1", "--lr", "1e-2", "--batch-size", "16", "--quiet", "--no-plots",
        "--device", "cpu")


def _all_keys(document, key):
    """Every value stored under ``key`` anywhere in a JSON document (except where each
    parameter's value came from: ``params_source``)."""
    found = []
    if isinstance(document, dict):
        for name, value in document.items():
            if name == "params_source":
                continue
            if name == key:
                found.append(value)
            found += _all_keys(value, key)
    elif isinstance(document, list):
        for value in document:
            found += _all_keys(value, key)
    return found


@pytest.mark.parametrize("loss, given, expected", [
    ("epr", (), {"k": None}),  # None: the labels file's mean positives
    ("epr", ("--param", "k=2.5"), {"k": 2.5}),
    ("role", (), {"k": None, "lr_mult": 10.0}),
    ("ll-r", (), {"delta_rel": 0.2}),
    ("em-apl", (), {"alpha": 0.1, "beta": 0.2, "theta": 0.9, "warmup": 5.0}),
    ("an-ls", (), {"eps_pos": 0.1, "eps_neg": 0.1}),
    ("an-ls", ("--eps-pos", "0"), {"eps_pos": 0.0, "eps_neg": 0.1}),
])
def test_stage_two_records_every_resolved_parameter_once(cache_dir, loss, given, expected):
    synthetic_dataset(cache_dir)
    result = invoke("train-linear", "--dataset", "toy", "--loss", loss, "--run-id", "p", *given, *FAST)
    assert result.exit_code == 0, result.output
    run = cache_dir / "toy" / "runs" / loss / "p"
    document = load_results(run)
    k = document["labels"]["mean_positives_per_train_image"]
    want = {key: (k if value is None else value) for key, value in expected.items()}
    assert set(want) == set(loss_class(loss).params)
    assert selected_params(document) == pytest.approx(want)
    assert document["grid"]["params"] == {key: [value] for key, value in want.items()}
    assert document["settings"]["params"] == document["grid"]["params"]
    for config in document["seeds"][0]["configs"]:
        assert config["params"] == pytest.approx(want)
    assert load_head(run)["params"] == pytest.approx(want)
    # No other copy of a parameter anywhere in the file: one value per name.
    for key, value in want.items():
        values = {json.dumps(v) for v in _all_keys(document, key)}
        assert values <= {json.dumps(value), json.dumps([value])}, (key, values)
    if "k" in want:
        source = "given" if given else "data"
        assert document["grid"]["params_source"]["k"] == source


@pytest.mark.slow  # fine-tunes a network
def test_stage_three_takes_the_parameters_from_the_linear_run(tmp_path_factory, tmp_path):
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    linear = load_head(linear_run(cache))
    result = finetune(cache, "--loss", "role", "--epochs", "1", "--lr", "1e-3", "--batch-size", "4",
                      "--run-id", "ft")
    assert result.exit_code == 0, result.output
    run = cache / NAME / "finetune" / "role" / "ft"
    document = load_results(run)
    assert selected_params(document) == linear["params"] == {"k": linear["params"]["k"], "lr_mult": 10.0}
    assert document["settings"]["params"] == linear["params"]
    assert json.loads((run / "run.json").read_text())["settings"]["params"] == linear["params"]
    assert json.loads((run / "run.json").read_text())["fingerprint"] == document["fingerprint"]


@pytest.mark.slow  # fine-tunes a network
def test_stage_three_uses_a_given_value_of_the_linear_run_for_its_loss(tmp_path_factory, tmp_path):
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    made = invoke("train-linear", "--dataset", NAME, "--loss", "an-ls", "--eps-pos", "0", "--lr",
                  "1e-2", "--batch-size", "4", "--epochs", "2", "--run-id", "lin", "--quiet",
                  "--no-plots", "--cache", cache)
    assert made.exit_code == 0, made.output
    result = finetune(cache, "--loss", "an-ls", "--epochs", "1", "--lr", "1e-3", "--batch-size", "4",
                      "--run-id", "ft")
    assert result.exit_code == 0, result.output
    document = load_results(cache / NAME / "finetune" / "an-ls" / "ft")
    assert selected_params(document) == {"eps_pos": 0.0, "eps_neg": 0.1}
    assert document["init"]["params"] == {"eps_pos": 0.0, "eps_neg": 0.1}


def test_a_head_file_of_format_one_still_loads(tmp_path_factory, tmp_path):
    import torch

    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    path = linear_run(cache) / "best.pt"
    head = torch.load(path, weights_only=True)
    phi = head.pop("handoff")["phi"]
    head.update(format_version=1, phi=phi, bsize=head.pop("batch_size"))
    torch.save(head, path)
    loaded = load_head(linear_run(cache))
    assert torch.equal(loaded["handoff"]["phi"], phi) and loaded["batch_size"] == 4
