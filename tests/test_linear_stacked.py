"""Every loss in one pass: losses stacked in one group train exactly as each alone (bit for bit
on the CPU), however the groups are cut."""

from __future__ import annotations

import pytest
import torch
from linear_fixtures import every_kind_of_data

from featcache.linear.engine.member import Member
from featcache.linear.engine.search import SearchSpec
from featcache.linear.engine.stacking import Stackable, balanced, fit_all, stacked_groups, unstacked
from featcache.linear.engine.trainer import GroupTrainer
from featcache.losses import loss_class, loss_names
from featcache.protocol.grid import GridPoint

EPOCHS = 2
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return every_kind_of_data(tmp_path_factory.mktemp("stacked"))


def _members(name: str, data, seed: int = 0, batch_size: int = 16) -> Member:
    spec = SearchSpec(loss=name, learning_rates=(1e-2, 1e-3), batch_sizes=(batch_size,),
                      epochs=EPOCHS).resolved(data.facts)
    return Member(name, tuple(spec.configs(seed)))


def _same(ours, theirs, name: str) -> None:
    assert len(ours) == len(theirs), name
    for a, b in zip(ours, theirs, strict=True):
        assert a.config == b.config and a.best_epoch == b.best_epoch, name
        assert a.epochs == b.epochs, name  # every epoch's record, train and test mAP included
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias), name
        assert torch.equal(a.test_ap, b.test_ap) and a.best_val == b.best_val, name
        assert a.state.keys() == b.state.keys(), name
        for key in a.state:
            assert torch.equal(a.state[key], b.state[key]), (name, key)


def _groups(data):
    pooled, spatial = data
    names = loss_names()
    searches = [Stackable(loss_class(n), spatial if loss_class(n).head.spatial else pooled,
                          EPOCHS, "clean", "none") for n in names]
    fitted = fit_all(pooled, [s.loss for s in searches if not s.loss.head.spatial])
    fitted += fit_all(spatial, [s.loss for s in searches if s.loss.head.spatial])
    order = [s for s in searches if not s.loss.head.spatial] + [s for s in searches
                                                                if s.loss.head.spatial]
    searches = [Stackable(s.loss, f, s.epochs, s.val_variant, s.early_stop)
                for s, f in zip(order, fitted, strict=True)]
    members = [[_members(s.loss.name, s.data)] for s in searches]
    return searches, stacked_groups(searches, members)


def test_every_loss_trained_in_a_stacked_group_equals_the_loss_alone(data):
    searches, groups = _groups(data)
    assert {g.kind for g in groups} >= {"linear", "boostlu", "cam"}
    assert max(len(g.members) for g in groups) >= 20  # most losses share one group
    for group in groups:
        members = [member for _, member in group.members]
        stacked = GroupTrainer(group.data, members, EPOCHS, "clean", "none", CPU)
        together = stacked.run(progress=False, position=0)
        for (_, member), results in zip(group.members, together, strict=True):
            alone = GroupTrainer(group.data, [member], EPOCHS, "clean", "none", CPU)
            _same(results, alone.run(progress=False, position=0)[0], member.loss)


def test_groups_keep_losses_with_other_inputs_apart(data):
    searches, groups = _groups(data)
    by_loss = {searches[i].loss.name: g for g in groups for i, _ in g.members}
    assert by_loss["an"] is by_loss["bce"] is by_loss["gr"]  # same features and labels
    # role trains phi beside its heads (Adam updates each head's slice of it on its own)
    assert by_loss["role"] is by_loss["an"]
    assert by_loss["iu"] is not by_loss["an"]  # observed negatives drawn for it
    assert by_loss["vlpl"] is not by_loss["an"] and by_loss["vlpl"] is not by_loss["gpr"]
    assert by_loss["an+boostlu"] is by_loss["ll-r+boostlu"]  # one spatial file, one kind
    assert by_loss["ignore"] is not by_loss["an+boostlu"]  # CAM heads, not BoostLU's
    for group in groups:  # one seed, one batch size, one kind of head per group
        assert len({m.configs[0].batch_size for _, m in group.members}) == 1


def test_groups_cut_for_the_workers_keep_every_loss_and_its_order(data):
    _, groups = _groups(data)
    assert balanced(groups, 1) == groups
    for workers in (2, 4):
        pieces = balanced(groups, workers)
        assert [m for g in pieces for m in g.members] == [m for g in groups for m in g.members]
        fair = sum(g.cost() for g in groups) / workers
        assert all(p.cost() <= fair or len(p.members) == 1 for p in pieces)
        assert len(pieces) > len(groups)
    alone = unstacked(groups)
    assert all(len(g.members) == 1 for g in alone)
    assert [m for g in alone for m in g.members] == [m for g in groups for m in g.members]


def test_a_stopped_head_of_one_loss_freezes_only_that_head(data):
    pooled, _ = data
    grid = tuple(GridPoint(lr, 16) for lr in (1e-1, 1e-2))
    members = [Member("an", grid), Member("role", grid)]
    stacked = GroupTrainer(pooled, members, 6, "clean", "zhou", CPU)
    together = stacked.run(progress=False, position=0)
    for member, results in zip(members, together, strict=True):
        alone = GroupTrainer(pooled, [member], 6, "clean", "zhou", CPU).run(False, 0)[0]
        _same(results, alone, member.loss)
