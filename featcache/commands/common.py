"""Options and parsers shared by several subcommands."""

from __future__ import annotations

import math

import click

from featcache.commands.repeated import ListOption
from featcache.paths import CACHE_ENV, DEFAULT_CACHE


class FiniteFloat(click.FloatRange):
    """A float option (optionally in a range) that refuses ``nan``, ``inf`` and ``-inf``, which
    Python's float() reads and a range check lets through (NaN fails no comparison)."""

    name = "float"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


#: a float option's type: any finite number
FINITE = FiniteFloat()
#: the most epochs a run may ask for: a typo (--epochs 100000000000000000000) is refused
#: before any work instead of being started
MAX_EPOCHS = 100_000
EPOCHS = click.IntRange(1, MAX_EPOCHS)
#: seeds of NumPy's RandomState (the protocol's observation, split and shapes): 0 to 2**32 - 1
NUMPY_SEED = click.IntRange(0, 2**32 - 1)
#: seeds of PyTorch's and NumPy's generators: 64-bit
TORCH_SEED = click.IntRange(-(2**63), 2**63 - 1)
GENERATOR_SEED = click.IntRange(0, 2**63 - 1)


cache_option = click.option(
    "--cache", "cache", type=click.Path(file_okay=False), default=None,
    help=f"Cache root (default: ${CACHE_ENV} or ./{DEFAULT_CACHE}).",
)

def dataset_option(help: str = "Dataset name under the cache (or its directory)."):
    """``--dataset NAME``; without it, the only dataset prepared in the cache
    (:func:`chosen_dataset`)."""
    return click.option("--dataset", default=None, metavar="NAME",
                        help=help + "  [default: the only dataset prepared in the cache]")


def chosen_dataset(dataset: str | None, cache: str | None) -> str:
    """``--dataset``, else the only dataset prepared in the cache (said in a note); with none
    or several prepared, one line naming them."""
    if dataset is not None:
        return dataset
    from featcache.errors import OptionError
    from featcache.paths import cache_root, prepared_datasets

    prepared, root = prepared_datasets(cache), cache_root(cache)
    if len(prepared) == 1:
        click.echo(f"note: --dataset {prepared[0]}: the only dataset prepared in {root}", err=True)
        return prepared[0]
    if not prepared:
        raise OptionError(f"--dataset NAME is missing and no dataset is prepared in {root}: "
                          "prepare one first (`featcache prepare --help` lists the formats)")
    raise OptionError(f"--dataset NAME is missing: give one of the datasets prepared in {root}: "
                      f"{', '.join(prepared)}")


overwrite_option = click.option(
    "--overwrite", is_flag=True, default=False,
    help="Replace an existing output (the old one stays until the new one is complete).",
)

device_option = click.option(
    "--device", default="auto", show_default=True,
    help="Torch device: auto (cuda when available, else cpu, with a warning), cpu, cuda, cuda:N.",
)


def preprocess_option(help: str):
    """``--preprocess native|protocol``: the backbone's own transform or the protocol's."""
    return click.option("--preprocess", type=click.Choice(["native", "protocol"]), default="native",
                        show_default=True, help=help)


pseudo_labels_option = click.option(
    "--pseudo-labels", "pseudo_labels", default=None, metavar="NAME",
    help="Pseudo-label set (`featcache pseudo-label --name`) for the losses that use pseudo-labels "
         "[default: each loss's own rule's: vlpl for vlpl, aevlp for gpr].",
)


tensorboard_option = click.option(
    "--tensorboard", "tensorboard", type=click.Path(file_okay=False), default=None,
    envvar="FEATCACHE_TENSORBOARD", show_envvar=True,
    help="Log each configuration's per-epoch train loss and val/test mAP, and the selected "
         "configuration's hyper-parameters, for TensorBoard under DIR/<dataset>/<loss>/"
         "<stage>-<run-id>/<lr>-<batch>-<seed> (needs `pip install 'featcache[tensorboard]'`; "
         "view with `tensorboard --logdir DIR`).")


def tensorboard_line(directory: str) -> str:
    """The closing line of a command that logged runs for TensorBoard."""
    import shlex

    return f"TensorBoard logs in {directory}: tensorboard --logdir {shlex.quote(str(directory))}"


val_option = click.option(
    "--val", "val_variant", type=click.Choice(["auto", "clean", "observed"]), default="auto",
    show_default=True,
    help="Validation labels used for selection: clean (the protocol), observed (the single "
         "positives), or auto: clean when the data has clean labels, else observed (said in one "
         "line; a single-positive CSV has no clean labels).")


def _numbers(kind, option: str):
    def convert(ctx, param, value):
        numbers = parse_number_list(value, option, kind=kind)
        if any(v <= 0 for v in numbers):
            raise click.BadParameter(f"must be positive, got {value}", param_hint=option)
        return numbers
    return convert


def learning_rates_option(help: str = "Learning rates of the grid (comma-separated or repeated)."):
    """``--lr 1e-2,1e-3,...``: the grid's learning rates, parsed and checked."""
    return click.option("--lr", "learning_rates", cls=ListOption, default="1e-2,1e-3,1e-4,1e-5",
                        show_default=True, callback=_numbers(float, "--lr"), help=help)


def batch_sizes_option(help: str = "Batch sizes of the grid (comma-separated or repeated; "
                                   "--bsize is an alias)."):
    """``--batch-size 8,16`` (alias ``--bsize``): the grid's batch sizes, parsed and checked."""
    return click.option("--batch-size", "--bsize", "batch_sizes", cls=ListOption, default="8,16",
                        show_default=True, callback=_numbers(int, "--batch-size"), help=help)


def parse_number_list(value: str, option: str, kind=float,
                      bounds: click.IntRange | None = None) -> list:
    """Parse ``"1e-2,1e-3"`` into numbers; the error names the option and the bad item. Floats
    must be finite (``inf``, ``nan``); integers inside ``bounds`` when given (seeds)."""
    items = [item.strip() for item in str(value).split(",") if item.strip()]
    if not items:
        raise click.BadParameter(f"{option} needs at least one value", param_hint=option)
    numbers = []
    for item in items:
        try:
            number = kind(item)
        except ValueError:
            expected = "an integer" if kind is int else "a number"
            raise click.BadParameter(f"{item!r} is not {expected}", param_hint=option) from None
        if kind is float and not math.isfinite(number):
            raise click.BadParameter(f"{item!r} is not a finite number", param_hint=option)
        if bounds is not None and not bounds.min <= number <= bounds.max:
            shown = item if len(item) <= 24 else item[:21] + "..."
            raise click.BadParameter(f"{shown} is outside {bounds.min} to {bounds.max}",
                                     param_hint=option)
        numbers.append(number)
    check_no_repeats(numbers, option)
    return numbers


def check_no_repeats(values: list, option: str) -> None:
    """A list option that gives a value twice (a grid would train it twice) is refused."""
    seen = set()
    for value in values:
        if value in seen:
            from featcache.errors import OptionError

            raise OptionError(f"{option} gives {value:g} twice; give each value once")
        seen.add(value)


def parse_params(pairs: tuple[str, ...]) -> dict[str, list]:
    """Parse repeated ``--param name=value[,value...]`` into {name: [values]}; a name given in
    two ``--param`` options is refused (a typo or an override, never meant as a grid: a grid
    axis is ``name=V1,V2``).

    A value is a number or ``estimate:M[:SEED]`` (estimated from M fully labelled training
    images, for the parameters that support it: EPR's and ROLE's k).
    """
    from featcache.data.kestimate import EstimateRequest
    from featcache.errors import OptionError

    params: dict[str, list] = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--param")
        name, value = pair.split("=", 1)
        name = name.strip()
        if not name:
            raise click.BadParameter(f"{pair!r} names no parameter (NAME=VALUE)",
                                     param_hint="--param")
        if name in params:
            first = next(p for p in pairs if p.split("=", 1)[0].strip() == name)
            before = first.split("=", 1)[1].strip()
            grid = ("" if before == value.strip() else f", or both values in one for a grid "
                    f"axis: --param {name}={before},{value.strip()}")
            raise OptionError(f"--param {name} is given twice ({first}, then {pair}): give it "
                              f"once{grid}")
        values: list = []
        for item in [item.strip() for item in value.split(",") if item.strip()] or [value]:
            try:
                request = EstimateRequest.parse(item)
            except OptionError as exc:
                raise click.BadParameter(str(exc), param_hint=f"--param {name}") from None
            values.append(request if request is not None else
                          parse_number_list(item, f"--param {name}")[0])
        check_no_repeats([v for v in values if isinstance(v, (int, float))], f"--param {name}")
        params[name] = values
    return params
