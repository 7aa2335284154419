"""The checks of the `sb_*` flags (`SelectiveBackpropArguments.__post_init__` runs them): each refusal names the
flag and what is allowed, before any data is read or model built; a flag with no effect on the strategy given warns."""

from __future__ import annotations

import logging
import math
import numbers
import os
import warnings

from .default_strategy import is_default
from .lr_schedule import check_milestones
from .record.scores import PRUNE_SCORES
from .selectors import strategy_names

logger = logging.getLogger(__name__)

SELECTION_MODES = ("eval", "train")
RHO_RULES = ("topk", "cdf")
SELECTION_PRECISIONS = ("auto", "fp32", "bf16", "fp16")
HISTORY_SCOPES = ("global", "local")
ANNEALING_STRATEGIES = ("infobatch", "early_prune", "early_coverage", "early_random", "early_class_budget")
#: Built-in strategies that never read --sb_anneal_delta (a registered one may).
NON_ANNEALING_STRATEGIES = ("none", "sb", "topk", "composer", "kath18", "uniform", "rholoss")
DEFAULT_KEEP = 1.0 / 3.0
#: The loss history holds R float32 losses, allocated at once; R beyond this is a typo, not a setting
#: (the paper uses 1024, and the CDF is recomputed over all R at every selection batch).
MAX_HISTORY_SIZE = 10**8


def check_selective_arguments(args) -> None:
    """Every sb_* flag (and the training arguments selection reads) refused here, before any data or model, naming
    the flag and what is allowed; a flag that has no effect on the strategy given warns."""

    def fail(flag: str, allowed: str, value) -> None:
        raise ValueError(f"--{flag} must be {allowed}, got {value!r}")

    def integer_at_least(flag: str, minimum: int, note: str = "") -> None:
        value = getattr(args, flag)
        # From Python a float (inf, 2.5) passes a plain `< minimum` test and breaks later in
        # range() or a tensor shape; Integral admits numpy integers; bool is one but never a count.
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            fail(flag, f"an integer >= {minimum}{note}", value)

    # Checked here rather than by torch's sampler: a zero batch size used to fail only after
    # the data was decoded and the model built.
    for flag in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        integer_at_least(flag, 1)
    if args.sb_strategy not in strategy_names():
        fail("sb_strategy", f"one of {', '.join(strategy_names())} (or a registered strategy)", args.sb_strategy)
    # Ranges are written so that NaN fails them too (every comparison with NaN is False).
    if args.sb_keep is not None and not 0.0 < args.sb_keep <= 1.0:
        fail("sb_keep", "in (0, 1]", args.sb_keep)
    if args.sb_beta is not None and not 0.0 < args.sb_beta < math.inf:
        fail("sb_beta", "a finite number > 0", args.sb_beta)
    if args.sb_keep is not None and args.sb_beta is not None:
        if abs(1.0 / (args.sb_beta + 1.0) - args.sb_keep) > 1e-6:
            raise ValueError(
                f"--sb_keep {args.sb_keep} and --sb_beta {args.sb_beta} disagree: beta keeps "
                f"1/(beta+1) = {1.0 / (args.sb_beta + 1.0):.4f}; give only one of them"
            )
    if args.lr_decay_milestones is not None:
        check_milestones(args.lr_decay_milestones, args.lr_decay_factor)
        if str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)) == "reduce_lr_on_plateau":
            fail("lr_scheduler_type", "a step-indexed schedule with --lr_decay_milestones", "reduce_lr_on_plateau")
    integer_at_least("sb_history_size", 1)
    if args.sb_history_size > MAX_HISTORY_SIZE:
        fail("sb_history_size", f"at most {MAX_HISTORY_SIZE:,} (the history allocates 4 bytes per loss up "
             f"front: {args.sb_history_size:,} would take {4 * args.sb_history_size / 1e9:,.0f} GB)",
             args.sb_history_size)
    if not 0.0 <= args.sb_min_prob <= 1.0:
        fail("sb_min_prob", "in [0, 1]", args.sb_min_prob)
    integer_at_least("sb_staleness", 1, " (1 = SB, n >= 2 = Stale-SB)")
    if args.sb_selection_batch_size is not None:
        integer_at_least("sb_selection_batch_size", 1)
    if args.sb_selection_mode not in SELECTION_MODES:
        fail("sb_selection_mode", f"one of {', '.join(SELECTION_MODES)}", args.sb_selection_mode)
    integer_at_least("sb_warmup_epochs", 0)
    if not args.sb_index_column:
        fail("sb_index_column", "a column name", args.sb_index_column)
    if not 0.0 <= args.sb_start < 1.0:
        fail("sb_start", "in [0, 1)", args.sb_start)
    if not args.sb_start < args.sb_end <= 1.0:
        fail("sb_end", f"in (sb_start={args.sb_start}, 1]", args.sb_end)
    integer_at_least("sb_interrupt", 0, " (0 = never)")
    if args.sb_presample is not None and not 1.0 < args.sb_presample < math.inf:
        fail("sb_presample", "a finite number > 1", args.sb_presample)
    if args.sb_selection_precision not in SELECTION_PRECISIONS:
        fail("sb_selection_precision", f"one of {', '.join(SELECTION_PRECISIONS)}", args.sb_selection_precision)
    if not 0.0 < args.sb_selection_scale <= 1.0:
        fail("sb_selection_scale", "in (0, 1]", args.sb_selection_scale)
    if not 0.0 <= args.sb_prune_ratio < 1.0:
        fail("sb_prune_ratio", "in [0, 1)", args.sb_prune_ratio)
    if args.sb_anneal_delta is not None and not 0.0 <= args.sb_anneal_delta <= 1.0:
        fail("sb_anneal_delta", "in [0, 1]", args.sb_anneal_delta)
    _check_reference(args)
    _check_budget(args)
    _check_subset(args)
    if args.sb_strategy != "none" and args.max_steps <= 0 and not args.num_train_epochs > 0:
        # Zero epochs would train nothing, then save the untrained model (and its card) as the run's.
        fail("num_train_epochs", "> 0 (or set --max_steps) for a run with selection", args.num_train_epochs)
    if args.sb_strategy != "none" and args.sb_warmup_epochs and args.max_steps <= 0 and (
            args.sb_warmup_epochs >= args.num_train_epochs):
        warnings.warn(
            f"--sb_warmup_epochs {args.sb_warmup_epochs} covers the whole run (--num_train_epochs "
            f"{args.num_train_epochs}): every example is trained and --sb_strategy {args.sb_strategy} never "
            "selects; lower --sb_warmup_epochs, or train longer",
            UserWarning, stacklevel=4,
        )
    if args.sb_strategy == "infobatch" and args.sb_keep is not None:
        warnings.warn(
            f"--sb_keep {args.sb_keep} does not apply to --sb_strategy infobatch, which prunes a random "
            f"--sb_prune_ratio ({args.sb_prune_ratio}) of the examples below the mean loss (infobatch is the "
            "default strategy); set that instead, or a strategy that trains a fraction (--sb_strategy uniform, "
            "sb, topk, ...)",
            UserWarning, stacklevel=4,
        )
    _check_annealing_knobs(args)
    if args.sb_anneal_delta is not None and args.sb_strategy in NON_ANNEALING_STRATEGIES:
        warnings.warn(
            f"--sb_anneal_delta {args.sb_anneal_delta} does not apply to --sb_strategy {args.sb_strategy}; it "
            f"sets the annealing of {', '.join(ANNEALING_STRATEGIES)}",
            UserWarning, stacklevel=4,
        )
    if args.sb_history_scope not in HISTORY_SCOPES:
        fail("sb_history_scope", f"one of {', '.join(HISTORY_SCOPES)}", args.sb_history_scope)
    if args.sb_strategy != "none" and args.train_sampling_strategy in ("group_by_length", "batch_rebalance"):
        # transformers 5 spells the old --group_by_length as --train_sampling_strategy group_by_length.
        # Not the padding: benchmarks/bench_length_grouping.py measured it mostly survives selection. The order
        # is drawn from the global random state when an epoch starts, and a resume that skips the rows the
        # epoch already read must replay that order: not shown for these samplers.
        raise ValueError(
            f"--train_sampling_strategy {args.train_sampling_strategy} (--group_by_length) cannot be combined "
            f"with --sb_strategy {args.sb_strategy}: its sampler draws the epoch's order from the global random "
            "state, which a resume inside the epoch (skipping the rows already read) is not shown to replay; "
            "use the default 'random'"
        )

def _check_annealing_knobs(args) -> None:
    """--sb_end and --sb_anneal_delta both say "everything again from this point of the run": a strategy that
    plans whole epochs takes one of them, and --sb_keep, which early pruning would otherwise default silently."""
    if args.sb_strategy not in ANNEALING_STRATEGIES:
        return
    if args.sb_end < 1.0 and args.sb_anneal_delta is not None:
        raise ValueError(
            f"--sb_end {args.sb_end} and --sb_anneal_delta {args.sb_anneal_delta} both train every example from "
            f"a point of the run on; --sb_strategy {args.sb_strategy} takes one: --sb_anneal_delta"
        )
    if args.sb_end < 1.0:
        warnings.warn(
            f"--sb_end {args.sb_end} with --sb_strategy {args.sb_strategy}, which plans whole epochs: an epoch "
            f"prunes only if it ends by {args.sb_end} of the run, so the end falls on an epoch boundary (on 2 "
            "epochs, 0.8 prunes none); --sb_anneal_delta is this strategy's setting for it",
            UserWarning, stacklevel=4,
        )
    if args.sb_strategy != "infobatch" and args.sb_keep is None and args.sb_beta is None:
        warnings.warn(
            f"--sb_strategy {args.sb_strategy} without --sb_keep keeps {DEFAULT_KEEP:.3g} of the examples from "
            "the second epoch on (the default); set --sb_keep to choose the share",
            UserWarning, stacklevel=4,
        )

def _check_budget(args) -> None:
    # Written so that NaN fails too.
    if args.sb_budget is not None and not 0.0 < args.sb_budget <= 1.0:
        raise ValueError(
            f"--sb_budget must be in (0, 1] (a share of the full run's cost), got {args.sb_budget!r}"
        )
    if args.sb_cost_phi is not None and not 0.0 < args.sb_cost_phi < math.inf:
        raise ValueError(f"--sb_cost_phi must be a finite number > 0, got {args.sb_cost_phi!r}")
    if args.sb_cost_phi is not None and args.sb_budget is None:
        raise ValueError("--sb_cost_phi prices selection forwards for --sb_budget: give --sb_budget as well")
    if args.sb_budget is not None and args.max_steps <= 0 and not args.num_train_epochs > 0:
        raise ValueError(
            f"--sb_budget {args.sb_budget} is a share of the full run, which --num_train_epochs "
            f"{args.num_train_epochs} leaves empty: set --num_train_epochs > 0 or --max_steps"
        )

def _check_subset(args) -> None:
    if args.sb_subset_from is None:
        if args.sb_subset_keep is not None:
            raise ValueError("--sb_subset_keep keeps a share of the examples an earlier run's record chooses: "
                             "give that record with --sb_subset_from")
        return
    if args.sb_subset_keep is None or not 0.0 < args.sb_subset_keep <= 1.0:
        raise ValueError(f"--sb_subset_from needs --sb_subset_keep in (0, 1] (the share of the training set "
                         f"kept), got {args.sb_subset_keep!r}")
    if args.sb_subset_by not in PRUNE_SCORES:
        raise ValueError(f"--sb_subset_by must be one of {', '.join(PRUNE_SCORES)}, got {args.sb_subset_by!r}")
    if is_default(args):  # the subset is the selection: the default does not prune it again
        logger.info("--sb_subset_from: every example of the subset trains each epoch (--sb_strategy none); "
                    "name a strategy with --sb_strategy to select within the subset as well")
        args.sb_strategy = "none"

def _check_reference(args) -> None:
    given = [flag for flag in ("sb_reference_model", "sb_reference_column") if getattr(args, flag) is not None]
    if len(given) == 2:
        raise ValueError(
            "--sb_reference_model and --sb_reference_column both give irreducible losses; give only one of them"
        )
    if given and args.sb_strategy != "rholoss":
        raise ValueError(
            f"--{given[0]} gives irreducible losses, which only --sb_strategy rholoss uses "
            f"(this run has --sb_strategy {args.sb_strategy}); drop the flag or use --sb_strategy rholoss"
        )
    if args.sb_reference_model is not None and not os.path.isdir(args.sb_reference_model):
        raise ValueError(
            f"--sb_reference_model {args.sb_reference_model!r}: no such folder; pass the folder a reference "
            "model was saved to (save_pretrained / scripts/train.py --output_dir)"
        )
    if args.sb_reference_column is not None and not args.sb_reference_column:
        raise ValueError("--sb_reference_column must name a column, got ''")
    if args.sb_rho_rule not in RHO_RULES:
        raise ValueError(f"--sb_rho_rule must be one of {', '.join(RHO_RULES)}, got {args.sb_rho_rule!r}")
