# featcache: every target runs inside .venv, which `make install` creates.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FEATCACHE := $(BIN)/featcache

DATASET ?= voc
# Extra options for `make features`, e.g. FEATURES_ARGS="--weights v2 --batch-size 128"
FEATURES_ARGS ?=
# SPATIAL=1: `make features` stores the feature maps too (--spatial: spatial-<tag>.h5, for BoostLU and IGNORE)
SPATIAL ?=
# The demo runs offline on a fresh machine: random backbone weights unless told otherwise
# (WEIGHTS=v1 uses torchvision's ImageNet weights, found offline or downloaded).
WEIGHTS ?= random
# The features file's tag: resnet50 for v1, resnet50-<weights> otherwise (docs/features.md).
DEMO_TAG := resnet50$(if $(filter v1,$(WEIGHTS)),,-$(WEIGHTS))
DEMO_RUN := demo-$(DEMO_TAG)
# The demo's folder: under $$FEATCACHE_CACHE when it is set (every featcache command reads it
# too), else under cache/.
DEMO_DIR := $(or $(FEATCACHE_CACHE),cache)/shapes
# The demo's image size (features and fine-tuning): small, so that its one fine-tuning
# configuration is quick on a CPU.
DEMO_IMAGE_SIZE ?= 96
# The demo's linear searches: the protocol's grid for 8 epochs (25 is the protocol's: make demo
# DEMO_EPOCHS=25), so that the whole demo runs in minutes on a 2-core CPU (its measured time:
# docs/performance.md).
DEMO_EPOCHS ?= 8

.PHONY: install test test-fast demo features lint bench gpu-check clean-demo real-features label-sets catalog docs help

help:
	@echo "make install   create .venv and install featcache with its dev tools and the timm/open_clip backbones"
	@echo "make demo      make install, then all three stages on the embedded 'shapes' dataset, offline (random weights; WEIGHTS=v1 for ImageNet's)"
	@echo "make test      the architecture contracts (lint-imports), the type checker (mypy), then the test suite (one pytest worker per core)"
	@echo "make test-fast the test suite without the tests marked slow (fine-tuning a network, torchrun ranks, resume, interrupts), one pytest worker per core"
	@echo "make features DATASET=voc [SPATIAL=1] [FEATURES_ARGS=...]   stage one for a prepared dataset (SPATIAL=1: feature maps for BoostLU and IGNORE too)"
	@echo "make lint      ruff, the import-linter architecture contracts and the type checker (mypy)"
	@echo "make catalog   rewrite featcache/protocol/catalog.json after adding or editing a loss or backbone (what the listings read without torch on a fresh clone)"
	@echo "make bench     speed benchmarks (benchmarks/), figures in cache/bench/"
	@echo "               (RECORD=1: also appended to benchmarks/record.jsonl; REFERENCE_CODE=PATH: also the authors' train.py from that clone)"
	@echo "make gpu-check validate the GPU paths on a CUDA machine, with the GPU benchmarks (CPU-able parts only without CUDA; docs/gpu-check.md)"
	@echo "make real-features [SHARED=PATH]   every loss on the real feature sets of ../shared/data (the README's results table; long on a CPU)"
	@echo "make label-sets [SHARED=PATH]   conformal label sets of the losses on scene, yeast and enron: docs/label-sets.md's measured table"
	@echo "make docs      render the README's and docs/'s generated blocks again from their records (the results table, the benchmark record)"

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,backbones,locks,tensorboard]'
	touch $(STAMP)

# The architecture contracts (pyproject.toml [tool.importlinter]) and the type checker
# ([tool.mypy]) are part of the tests.
test: install
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# The quick loop while working: the tests not marked slow (pyproject.toml's `slow` marker:
# fine-tuning a network, torchrun ranks, resume, interrupts, and any test over a few seconds).
test-fast: install
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow"

demo: install
	test -f $(DEMO_DIR)/labels.h5 || $(FEATCACHE) prepare shapes
	$(FEATCACHE) features --dataset shapes --weights $(WEIGHTS) --image-size $(DEMO_IMAGE_SIZE)
	$(FEATCACHE) train-linear --dataset shapes --backbone $(DEMO_TAG) --loss all --epochs $(DEMO_EPOCHS) --run-id $(DEMO_RUN) --quiet
	$(FEATCACHE) finetune --dataset shapes --loss role --init best --epochs 1 --lr 1e-4 --batch-size 16 --run-id $(DEMO_RUN) --overwrite
	$(FEATCACHE) table $(DEMO_DIR)/runs/*/$(DEMO_RUN) --format latex --out $(DEMO_DIR)/table-$(DEMO_RUN).tex --overwrite
	$(FEATCACHE) predict --run $(DEMO_DIR)/finetune/role/$(DEMO_RUN) $(DEMO_DIR)/images/test --out $(DEMO_DIR)/predictions-$(DEMO_RUN).csv --quiet --overwrite
	$(FEATCACHE) cam --run $(DEMO_DIR)/runs/an/$(DEMO_RUN) --run $(DEMO_DIR)/runs/ll-r/$(DEMO_RUN) --run $(DEMO_DIR)/finetune/role/$(DEMO_RUN) $(DEMO_DIR)/images/test/000005.jpg --out $(DEMO_DIR)/cam-$(DEMO_RUN).png --overwrite
	$(FEATCACHE) report $(DEMO_DIR) --runs $(DEMO_RUN) --title "featcache demo: shapes, $(DEMO_TAG) features" --out $(DEMO_DIR)/report-$(DEMO_RUN).html --overwrite
	@echo "demo finished: open $(DEMO_DIR)/report-$(DEMO_RUN).html in a browser (all of it on one page); also $(DEMO_DIR)/runs/table-$(DEMO_RUN).md, $(DEMO_DIR)/finetune/role/$(DEMO_RUN)/summary.md, $(DEMO_DIR)/table-$(DEMO_RUN).tex, $(DEMO_DIR)/predictions-$(DEMO_RUN).csv and $(DEMO_DIR)/cam-$(DEMO_RUN).png"

features: install
	$(FEATCACHE) features --dataset $(DATASET)$(if $(SPATIAL), --spatial) $(FEATURES_ARGS)

# `featcache losses`/`backbones`/`table` read this snapshot instead of importing torch; where it
# no longer matches the sources, the first listing builds the data once and keeps it in the
# user's cache folder. tests/test_catalog.py fails where an entry differs from its class.
catalog: install
	$(BIN)/python -m featcache.protocol.catalog

lint: install
	$(BIN)/ruff check featcache tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy

# REFERENCE_CODE=PATH (a clone of elijahcole/single-positive-multi-label) adds the authors' own
# train.py to stage two's side-by-side figures; RECORD=1 appends every figure to the benchmark
# record (benchmarks/record.py), from which `make docs` renders docs/performance.md.
REFERENCE_CODE ?=
RECORD ?=
bench: install
	FEATCACHE_REFERENCE_CODE=$(REFERENCE_CODE) $(if $(RECORD),FEATCACHE_BENCH_RECORD=$(CURDIR)/benchmarks/record.jsonl) $(BIN)/python -m benchmarks

# The generated blocks of README.md and docs/: each from its record, nothing re-run
# (tests/test_generated_docs.py fails when one differs from what its record gives).
docs: install
	$(FEATCACHE) pipeline render pipelines/real-features.toml
	$(BIN)/python -m benchmarks.record render

# The GPU check runs where the project is not installed too (a lent GPU machine with its own
# PyTorch): the repository on PYTHONPATH, the venv's python if there is one, else python3.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

clean-demo:
	rm -rf $(DEMO_DIR)

# SHARED=PATH: the real data folder (default: shared/data beside the repository's folder,
# resolved from the recipe's place, whatever the working directory)
SHARED ?=
real-features: install
	$(FEATCACHE) pipeline run pipelines/real-features.toml$(if $(SHARED), --set shared=$(SHARED))

# docs/label-sets.md's measured block: label sets of each loss on the real feature sets
label-sets: install
	$(BIN)/python -m benchmarks.label_sets --write-docs$(if $(SHARED), --shared $(SHARED))
