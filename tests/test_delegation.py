"""`Held`: an engine attribute read from and set on the collaborator that owns it."""

from types import SimpleNamespace

from hf_selective_backprop.engine.delegation import Held


class Owner:
    epoch = Held("planner")
    spent = Held("meter", "budget_spent")
    observe = Held("meter")

    def __init__(self):
        self.planner = SimpleNamespace(epoch=0)
        self.meter = SimpleNamespace(budget_spent=1.5, observe=lambda value: value * 2)


def test_reads_and_writes_go_to_the_holder_under_its_name():
    owner = Owner()
    owner.epoch += 2
    owner.spent = 3.0
    assert owner.planner.epoch == 2 and owner.meter.budget_spent == 3.0
    assert "epoch" not in vars(owner) and "spent" not in vars(owner)  # one value, the holder's
    assert owner.observe(4) == 8


def test_a_replaced_method_is_replaced_where_the_holder_calls_it():
    owner = Owner()
    owner.observe = lambda value: -value
    assert owner.meter.observe(4) == -4
    assert isinstance(Owner.epoch, Held)  # on the class: the descriptor, which a patch can replace and restore
