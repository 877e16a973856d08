"""Stage one's default decoder, decided from the extraction benchmark's figures on a GPU.

``make gpu-check`` runs ``benchmarks.extract --gpu-decode`` at 224 and 448 px and prints what
:func:`decide` makes of them: the rule, the figures it read, its verdict, and at 224 px whether
end to end reached :data:`TARGET_224` images/s and, if not, what limits it.

The rule: PIL stays the default unless ``--gpu-decode`` is at least :data:`DEFAULT_GAIN` times
faster end to end at 224 px, no slower at 448 px, and its features are within the tolerances
of the gpu-check's "extraction: --gpu-decode vs PIL"; then it becomes the default on CUDA. A
``--gpu-decode`` slower than PIL end to end at both sizes is retired. Otherwise it stays an
option, worth passing at the sizes where it is faster.

Verdicts so far:

- 2026-11-26, one H200 (before the honest windows of ``benchmarks/window.py``): slower than PIL
  end to end at 448 px -> PIL stayed the default.
- 2026-11-28, one H200 (``docs/gpu-runs/2026-11-28-h200/gpu-check/gpu-check.json``, check
  "decoder choice"; its rows are in ``benchmarks/record.jsonl`` and ``docs/performance.md``):
  224 px PIL 2,900, ``--gpu-decode`` 9,118 img/s end to end (3.14x); 448 px PIL 1,978,
  ``--gpu-decode`` 3,280 (1.66x); inputs 0.409 grey levels apart on average (tolerance 2.0),
  features a relative error of at most 0.0026 (tolerance 0.08) -> **default**. Since then a run
  on CUDA decodes its JPEGs on the device unless told otherwise (``--pil-decode``), keeping the
  decoder a file on disk already records (:mod:`featcache.features.decoder`).

Each verdict's line also says whether featcache's shipped default is in step with it
(:data:`featcache.features.decoder.AUTO_ON_CUDA`).
"""

from __future__ import annotations

from featcache.features.decoder import AUTO_ON_CUDA

#: images/s end to end at 224 px on one H100/H200 (issue 37: 75 % of the forward at batch 64)
TARGET_224 = 9000.0
#: how much faster end to end at 224 px --gpu-decode must be to become the default
DEFAULT_GAIN = 1.10
#: end to end below this share of its slowest stage means the stages do not overlap
OVERLAP_SHARE = 0.85

PIL, DEVICE = "end to end, ours (PIL)", "end to end, ours (--gpu-decode)"
RULE = (f"--gpu-decode becomes the default on CUDA when it is >= {DEFAULT_GAIN:.2f}x PIL end to end "
        "at 224 px, no slower at 448 px, and within the feature tolerances; it is retired when "
        "slower than PIL end to end at both sizes; otherwise it stays an option")


def decide(at224: dict[str, float], at448: dict[str, float] | None, features_ok: bool) -> dict:
    """``at224``/``at448``: a row label of ``benchmarks.extract --gpu-decode`` -> images/s.
    Returns the verdict (``default``, ``option`` or ``retire``), the ratios and one line."""
    ratios = {size: rows[DEVICE] / rows[PIL] for size, rows in ((224, at224), (448, at448))
              if rows and PIL in rows and DEVICE in rows}
    r224, r448 = ratios.get(224), ratios.get(448)
    if r224 is None:
        raise ValueError("the 224 px rows lack an end-to-end figure for PIL or --gpu-decode")
    if features_ok and r224 >= DEFAULT_GAIN and r448 is not None and r448 >= 1.0:
        verdict = "default"
    elif r224 < 1.0 and (r448 is None or r448 < 1.0):
        verdict = "retire"
    else:
        verdict = "option"
    action = {"default": "make --gpu-decode the default on CUDA",
              "retire": "retire --gpu-decode (it does not beat PIL end to end)",
              "option": "keep PIL the default and --gpu-decode an option"}[verdict]
    figures = "; ".join(f"{size} px: PIL {rows[PIL]:,.0f}, --gpu-decode {rows[DEVICE]:,.0f} img/s "
                        f"end to end ({ratios[size]:.2f}x)"
                        for size, rows in ((224, at224), (448, at448)) if size in ratios and rows)
    shipped = "default" if AUTO_ON_CUDA == "device" else "option"
    in_step = (verdict == "default") == (shipped == "default")
    line = (f"{figures}; features within tolerance: {'yes' if features_ok else 'no'} -> {action} "
            f"(rule: {RULE}); featcache's default on CUDA is "
            f"{'--gpu-decode' if shipped == 'default' else 'PIL'}: "
            + ("in step" if in_step else "out of step, see featcache/features/decoder.py"))
    return {"verdict": verdict, "ratios": ratios, "line": line, "target": target(at224),
            "shipped": shipped, "in_step": in_step}


def target(rows: dict[str, float]) -> dict:
    """Whether the best end-to-end rate at 224 px reaches :data:`TARGET_224`, and what limits it."""
    best_label = max((PIL, DEVICE), key=lambda label: rows.get(label, 0.0))
    best = rows.get(best_label, 0.0)
    decoder = "--gpu-decode" if best_label == DEVICE else "PIL"
    stages = {"the forward": rows.get("forward only"),
              f"decoding ({decoder}, loader included)": rows.get(f"decode only, {decoder}")}
    if decoder == "--gpu-decode":
        stages["the device decoder alone"] = rows.get("device decode alone")
    measured = {name: rate for name, rate in stages.items() if rate}
    slowest = min(measured, key=measured.__getitem__) if measured else None
    met = best >= TARGET_224
    if met or slowest is None:
        limit = ""
    elif best >= OVERLAP_SHARE * measured[slowest]:
        limit = f"limited by {slowest} ({measured[slowest]:,.0f} img/s)"
    else:
        serial = 1 / sum(1 / rate for name, rate in measured.items() if name != "the device decoder alone")
        limit = (f"below each stage alone ({', '.join(f'{n} {r:,.0f}' for n, r in measured.items())} "
                 f"img/s): the stages do not overlap (one after the other would give {serial:,.0f})")
    line = (f"224 px end to end: {best:,.0f} img/s with {decoder}, target {TARGET_224:,.0f}: "
            + ("met" if met else f"not met, {limit}"))
    return {"met": met, "best": best, "decoder": decoder, "stages": measured, "line": line}
