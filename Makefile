# Set-up and everyday commands. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MDS := $(BIN)/mds
DEMO := build/demo
# The CPU wheel of this torch release is what the project is tested with; installing it
# first, from TORCH_INDEX, keeps the `train` extra from resolving torch to another build.
TORCH_PIN ?= torch==2.13.0
# The package index torch comes from: empty for pip's configured one; PyTorch's own index
# picks the build, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu for CPU or
# .../whl/cu126 for CUDA 12.6 (on Linux, PyPI's torch is a multi-GB CUDA build).
TORCH_INDEX ?=
TORCHRUN := OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node=2

.PHONY: setup dist demo test test-quick test-fast lint bench soak golden clean sample-data

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_PIN)"
	# a venv made before the distribution was renamed to mds-planner still holds `mds`
	$(BIN)/python -m pip uninstall --quiet --yes mds 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[plan,train,tokenizers,vision,dev]"
	touch $@

# The wheel to install elsewhere (the distribution is on no package index):
# pip install 'dist/mds_planner-<version>-py3-none-any.whl[plan]'
dist: setup
	rm -f dist/mds_planner-*.whl
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w dist .
	@ls dist/mds_planner-*.whl

demo: setup
	rm -rf $(DEMO)
	$(MDS) index sample_data/mds.toml -o $(DEMO)/index
	$(MDS) index sample_data/mds.toml -o $(DEMO)/index --json > $(DEMO)/index-summary.json
	$(MDS) plan sample_data/mds.toml --index $(DEMO)/index -o $(DEMO)/plan.mds
	$(MDS) export $(DEMO)/plan.mds -o $(DEMO)/plan.parquet
	$(MDS) inspect $(DEMO)/plan.mds --html $(DEMO)/report.html
	$(MDS) inspect $(DEMO)/plan.mds
	$(MDS) verify $(DEMO)/plan.mds
	$(MDS) plan sample_data/mds.toml --index $(DEMO)/index -o $(DEMO)/plan-dp2.mds --dp-size 2
	$(TORCHRUN) examples/train_tiny.py --plan $(DEMO)/plan-dp2.mds --steps 4 --checkpoint $(DEMO)/train
	$(TORCHRUN) examples/train_tiny.py --plan $(DEMO)/plan-dp2.mds --steps 8 --checkpoint $(DEMO)/train --resume
	$(MDS) index sample_data/vlm.toml -o $(DEMO)/vlm-index
	$(MDS) plan sample_data/vlm.toml --index $(DEMO)/vlm-index -o $(DEMO)/vlm-plan.mds
	$(MDS) inspect $(DEMO)/vlm-plan.mds --html $(DEMO)/vlm-report.html
	@echo "demo: index, plan, export, report and a resumed 2-rank training run in $(DEMO)/"

# The whole suite, then the 15 slowest tests; `make test-quick` leaves out those marked slow.
test: setup
	$(BIN)/python -m pytest --durations=15

test-quick: setup
	$(BIN)/python -m pytest -m "not slow"

# A loop while editing, about a minute on 2 busy cores: the index and plan tests and the
# index/export/diff command lines, less those marked slow (no fuzzing, object stores,
# executor or training runs); `make test-quick` is every test not marked slow.
FAST_TESTS := tests/planner/index tests/planner/plan tests/test_errors.py \
	tests/cli/test_main_cli.py tests/cli/test_index_cli.py tests/cli/test_export_cli.py \
	tests/cli/test_diff_cli.py
test-fast: setup
	$(BIN)/python -m pytest -m "not slow" $(FAST_TESTS)

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python bench/bench_index.py --out build/bench
	$(BIN)/python bench/bench_reindex.py --out build/bench
	$(BIN)/python bench/bench_plan.py --out build/bench
	$(BIN)/python bench/bench_readers.py --out build/bench
	$(BIN)/python bench/bench_budget.py --out build/bench
	$(BIN)/python bench/bench_executor.py --out build/bench
	$(BIN)/python bench/bench_scale.py --out build/bench
	$(BIN)/python bench/bench_peers.py --out build/bench
	$(BIN)/python bench/bench_memory.py --out build/bench
	$(BIN)/python bench/bench_recheck.py --out build/bench
	$(BIN)/python bench/bench_storage.py --out build/bench
	$(BIN)/python bench/bench_first_reads.py --out build/bench
	$(BIN)/python bench/bench_calibrate.py --out build/bench
	$(BIN)/python bench/bench_real_model.py --out build/bench
	$(BIN)/python bench/bench_engine.py --out build/bench
	$(BIN)/python bench/bench_vision_balance.py --out build/bench
	$(BIN)/python bench/bench_vision_index.py --out build/bench
	$(BIN)/python bench/bench_vision_executor.py --out build/bench
	$(BIN)/python bench/bench_cp.py --out build/bench
	$(BIN)/python bench/bench_fanout.py --out build/bench
	$(BIN)/python bench/bench_trace.py --out build/bench
	$(BIN)/python bench/bench_exclude.py --out build/bench
	$(BIN)/python bench/bench_planfile.py --out build/bench
	$(BIN)/python bench/bench_online.py --out build/bench

# Kill-and-resume soak: SIGKILL the 2-rank training example at SOAK_KILLS seeded random
# moments and check that the final model trained on exactly the plan's samples.
SOAK_KILLS ?= 200
soak: setup
	mkdir -p build/soak
	$(MDS) index sample_data/mds.toml -o build/soak/index
	$(MDS) plan sample_data/mds.toml --index build/soak/index -o build/soak/plan-dp2.mds --dp-size 2
	$(BIN)/python tests/examples/soak.py --plan build/soak/plan-dp2.mds --work build/soak/runs --kills $(SOAK_KILLS) --steps 16

golden: setup
	$(BIN)/python tests/golden/regenerate.py

sample-data: setup
	$(BIN)/python sample_data/generate.py

clean:
	rm -rf build dist .pytest_cache
