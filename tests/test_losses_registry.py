"""The loss registry as a whole: names, errors, requirements, stacked heads, `featcache losses`."""

from __future__ import annotations

import warnings

import pytest
import torch
from click.testing import CliRunner
from shipped_losses import SHIPPED_LOSSES, readme_table_names

from featcache.cli import cli
from featcache.data.kestimate import positive_histogram
from featcache.errors import OptionError
from featcache.losses import (
    DataFacts,
    MaskedPassLoss,
    Targets,
    create_loss,
    loss_class,
    loss_names,
)

#: the losses checked by name here: the shipped ones (README's method table) and those added
#: since the table was last regenerated (`featcache losses --markdown`)
ADDED_SINCE = ["lc-max", "lc-dist", "lc-exact"]
EXPECTED_NAMES = [name for name in loss_names() if name in {*SHIPPED_LOSSES, *ADDED_SINCE}]
DATA_PARAMS = {"k": 1.5, "k_max": 3.0}  # what the trainer supplies from the labels file


def test_every_shipped_loss_is_registered_once_in_order():
    names = loss_names()
    assert len(names) == len(set(names))
    assert [name for name in names if name in SHIPPED_LOSSES] == SHIPPED_LOSSES
    assert set(ADDED_SINCE) <= set(names)


@pytest.mark.parametrize("name", loss_names())
def test_every_loss_describes_itself(name):
    cls = loss_class(name)
    assert cls.summary and "\n" not in cls.summary and cls.reference and cls.__doc__
    assert cls.paper and 2015 < cls.year < 2030
    assert all(param.help for param in cls.params.values())
    for overrides in cls.dataset_defaults.values():
        assert set(overrides) <= set(cls.params)
        assert all(cls.params[key].accepts(value) for key, value in overrides.items())
    for key, param in cls.params.items():
        assert param.default is None or param.accepts(param.default), key


def test_needs_are_declared_for_the_losses_that_need_more_data():
    needs = {name: {need.key for need in loss_class(name).needs} for name in EXPECTED_NAMES}
    assert needs.pop("bce") == needs.pop("bce-ls") == needs.pop("iun") == {"full_labels"}
    assert needs.pop("iu") == {"observed_negatives"}
    assert needs.pop("vlpl") == needs.pop("gpr") == {"pseudo_labels"}
    assert needs.pop("lc-exact") == {"exact_cardinality"}
    assert needs.pop("lc-dist") == {"cardinality_distribution"}
    for name in ("an+boostlu", "ll-r+boostlu", "ll-ct+boostlu", "ll-cp+boostlu", "ignore"):
        assert needs.pop(name) == {"spatial_features"}
    assert all(not value for value in needs.values())


def test_unknown_loss_names_the_closest_ones_or_lists_all():
    with pytest.raises(OptionError) as error:
        create_loss("an-lss", 3)
    assert str(error.value).startswith("unknown loss 'an-lss'; did you mean 'an-ls'")
    with pytest.raises(OptionError) as error:
        create_loss("xyzzy", 3)
    assert "'xyzzy'" in str(error.value) and "an-ls" in str(error.value) and "opml-sp" in str(error.value)


def test_unknown_parameter_lists_the_valid_ones():
    with pytest.raises(OptionError, match="no parameter 'eps'.*eps_neg, eps_pos"):
        create_loss("an-ls", 3, params={"eps": 0.2})
    with pytest.raises(OptionError, match="no parameter 'eps_nge'; did you mean 'eps_neg'"):
        create_loss("an-ls", 3, params={"eps_nge": 0.2})
    with pytest.raises(OptionError, match="no parameter 'alpha'; its parameters are: none"):
        create_loss("an", 3, params={"alpha": 0.2})


def test_k_must_come_from_the_data():
    data_decided = {name for name in EXPECTED_NAMES
                    if any(p.from_data is not None for p in loss_class(name).params.values())}
    assert data_decided == {"epr", "role", "gpr", "lc-max"}  # GPR adds EPR; lc-max's k, k_max
    assert loss_class("role").default_values("coco")["k"] is None
    with pytest.raises(OptionError, match="--param k=VALUE"):
        create_loss("epr", 3)
    facts = DataFacts(dataset="toy", num_classes=3, mean_positives=1.7)
    resolved = loss_class("role").resolve({}, facts=facts)
    assert resolved.single() == {"k": 1.7, "lr_mult": 10.0}
    assert resolved.sources == {"k": "data", "lr_mult": "default"}
    assert loss_class("role").resolve({"k": 2.5}, facts=facts).values["k"] == [2.5]


@pytest.mark.parametrize("name, params, shown", [
    ("an-ls", {"eps_pos": 1.5}, r"eps_pos=1.5 is out of range: eps_pos takes \[0, 1\]"),
    ("epr", {"k": -1.0}, r"k=-1 is out of range: k takes \(0, inf\)"),
    ("ll-r", {"delta_rel": 150.0}, r"delta_rel=150 is out of range: delta_rel takes \[0, 100\]"),
    ("em-apl", {"warmup": 2.5}, r"warmup=2.5 is out of range: warmup takes whole numbers"),
    ("opml-sp", {"rank": 2.0}, r"rank=2 is out of range: rank takes 0 or 1"),
    ("focal", {"gamma": float("nan")}, r"gamma=nan is out of range"),
])
def test_out_of_range_parameters_are_refused_with_the_range(name, params, shown):
    with pytest.raises(OptionError, match=shown):
        create_loss(name, 3, params={**params, **({"k": 1.0} if name == "epr" and "k" not in params else {})})


def test_per_head_values_must_match_the_head_count():
    with pytest.raises(OptionError, match="3 values for 2 heads"):
        create_loss("focal", 3, num_heads=2, params={"gamma": [1, 2, 3]})


# ------------------------------------------------------------------ every loss, generically
def random_problem(seed: int, rows: int = 10, classes: int = 5):
    """Clean labels, observed single positives plus one observed negative per row (and, for the
    losses that use them, pseudo-labels: ``pseudo_problem``)."""
    gen = torch.Generator().manual_seed(seed)
    clean = (torch.rand(rows, classes, generator=gen) < 0.4).float()
    first = torch.randint(0, classes, (rows,), generator=gen)
    clean[torch.arange(rows), first] = 1
    observed = torch.zeros(rows, classes)
    observed[torch.arange(rows), first] = 1
    for n in range(rows):
        negatives = torch.nonzero(clean[n] == 0).flatten()
        if len(negatives):
            observed[n, negatives[0]] = -1
    features = torch.randn(rows, 6, generator=gen)
    return features, observed, clean


def pseudo_problem(seed: int, rows: int = 10, classes: int = 5) -> torch.Tensor:
    """Seeded pseudo-labels 1 / 0 / -1."""
    gen = torch.Generator().manual_seed(seed + 100)
    return torch.randint(-1, 2, (rows, classes), generator=gen).float()


def train(name, heads, params, epochs=3, batch=4, seed=0):
    """A few epochs of plain SGD on stacked linear heads; the loss values per step and state."""
    features, observed, clean = random_problem(seed)
    pseudo = pseudo_problem(seed)
    classes = observed.shape[1]
    facts = DataFacts("toy", classes, positives_histogram=positive_histogram(clean.numpy()))
    loss = create_loss(name, classes, heads, params=params, facts=facts)  # lc-dist reads P(k)
    state = loss.init_state(observed, clean, generator=torch.Generator().manual_seed(1))
    weight = (0.5 * torch.randn(6, classes, generator=torch.Generator().manual_seed(2)))
    weight = weight.expand(heads, -1, -1).clone().requires_grad_(True)
    trainable = [state[key] for key in loss.learned_state_lr_mults()]
    values = []
    for epoch in range(epochs):
        loss.begin_epoch(epoch, epochs, state)
        for start in range(0, features.shape[0] - batch + 1, batch):
            index = torch.arange(start, start + batch)
            logits = torch.einsum("bd,hdl->hbl", features[index], weight)
            targets = Targets(observed[index], index, clean[index], pseudo[index])
            if isinstance(loss, MaskedPassLoss):  # IGNORE: the logits of half the features, as a masked pass's
                targets.masked = torch.einsum("bd,hdl->hbl", 0.5 * features[index],
                                              weight).detach()
            value = loss.forward(logits, targets, state, epoch)
            assert value.shape == (heads,)
            grads = torch.autograd.grad(value.sum(), [weight, *trainable])
            assert all(torch.isfinite(g).all() for g in grads), name
            with torch.no_grad():
                weight -= 0.5 * grads[0]
                for tensor_, grad in zip(trainable, grads[1:], strict=True):
                    tensor_ -= 0.5 * grad
            values.append(value.detach())
        with torch.no_grad():
            loss.end_epoch(epoch, epochs, lambda w=weight: torch.sigmoid(features @ w), state)
    return torch.stack(values), state


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_every_loss_trains_three_heads_without_nan(name):
    params = {k: v for k, v in DATA_PARAMS.items() if k in loss_class(name).params}
    values, state = train(name, 3, params)
    assert torch.isfinite(values).all()
    for key, tensor_ in state.items():
        if tensor_.is_floating_point() and key != "pseudo":
            assert torch.isfinite(tensor_).all(), key


def alternative(param, value: float) -> float:
    """Another valid value of a parameter, for the second head (switches 1 -> 0)."""
    if param.integer:
        return 1.0 - value if param.high == 1.0 else value + 1.0
    return value / 2 if value else 0.5


#: values that make the per-example state change within the 3 test epochs
STATE_CHANGING = {
    "ll-cp": {"delta_rel": 20.0}, "ll-cp-abs": {"r0": 0.5}, "em-apl": {"warmup": 2.0},
    "opml-sp": {"correct_ratio": 0.2}, "ignore": {"warm_up": 1.0},
}


@pytest.mark.parametrize("name", [n for n in EXPECTED_NAMES if loss_class(n).params])
def test_per_head_parameters_match_separate_single_head_runs(name):
    cls = loss_class(name)
    first = {key: (DATA_PARAMS[key] if p.default is None else p.default)
             for key, p in cls.params.items()}
    first.update(STATE_CHANGING.get(name, {}))
    second = {key: alternative(cls.params[key], value) for key, value in first.items()}
    stacked, stacked_state = train(name, 2, {key: [first[key], second[key]] for key in first})
    if name in STATE_CHANGING:
        initial = loss_class(name)(5, 2, params=first).init_state(random_problem(0)[1])
        changed = [key for key in initial
                   if not torch.allclose(initial[key].double(), stacked_state[key].double(), equal_nan=True)]
        assert changed, f"{name}: the test epochs never changed the state"
    for head, params in enumerate((first, second)):
        single, single_state = train(name, 1, params)
        torch.testing.assert_close(stacked[:, head], single[:, 0], rtol=1e-5, atol=1e-6)
        for key in single_state:
            torch.testing.assert_close(stacked_state[key][head], single_state[key][0],
                                       rtol=1e-5, atol=1e-6, equal_nan=True)


# ------------------------------------------------------------------------ featcache losses
def test_losses_command_lists_every_loss_with_parameters_and_dataset_defaults():
    # the terminal's width decides the wrapping: the fallback's, whatever runs the test
    result = CliRunner().invoke(cli, ["losses"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    for name in loss_names():
        assert f"\n{name} " in result.output
    assert "eps_pos=0.1 in [0, 1], eps_neg=0.1 in [0, 1]" in result.output
    assert "k=(labels file) in (0, inf)" in result.output
    assert "w_start=0 in (-inf, inf)" in result.output  # unbounded: open on both sides
    assert "paper: Boosting Single Positive Multi-label Classification" in result.output
    assert "voc: alpha=0.2, beta=0.02, theta=0.9, warmup=5" in result.output


def test_losses_command_markdown_has_one_row_per_loss():
    result = CliRunner().invoke(cli, ["losses", "--markdown"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == loss_names()
    assert "| `iu` |" in result.output and "observed negatives |" in result.output
    assert "| `splc` | Zhang et al. arXiv 2021 | 2021 | Simple and Robust Loss Design" in result.output


def test_losses_command_details_and_unknown_names():
    result = CliRunner().invoke(cli, ["losses", "ll-cp"])
    assert result.exit_code == 0 and "delta_rel = 0.2, in [0, 100]: rejection-rate increase" in result.output
    result = CliRunner().invoke(cli, ["losses", "qqqq"])
    assert result.exit_code != 0 and "unknown loss 'qqqq'; valid losses: bce" in result.output
    result = CliRunner().invoke(cli, ["losses", "roel"])
    assert result.exit_code != 0 and "unknown loss 'roel'; did you mean 'role'?" in result.output


def test_readme_method_table_is_the_command_output():
    """README.md's method table is `featcache losses --markdown`: every shipped loss, each row
    the command's, in its order. A loss added since (one new module) is warned about, not
    failed: the README is regenerated when it is published."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    result = CliRunner().invoke(cli, ["losses", "--markdown"])
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    rows = {line.split("`")[1]: line for line in lines if line.startswith("| `")}
    header = [line for line in lines if not line.startswith("| `")]
    listed = readme_table_names(readme, header)
    assert set(SHIPPED_LOSSES) <= set(listed), "regenerate with `featcache losses --markdown`"
    assert listed == [name for name in loss_names() if name in listed]
    for name in listed:
        assert rows[name] in readme.splitlines(), f"{name}: regenerate with `featcache losses --markdown`"
    missing = [name for name in loss_names() if name not in listed]
    if missing:
        warnings.warn(f"README.md's method table lacks {missing}: regenerate it with "
                      "`featcache losses --markdown`", stacklevel=1)


