# The two commands a newcomer needs:  make lab   and   make test
# Everything else here is plumbing for them, plus the exercise tools.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# JupyterLab refuses to run as root unless told it may (CI and containers run as root).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
PORT   ?= 8888
# Appendix notebooks (notebooks/appendix_*.ipynb) need PyTorch, which learners need not install:
# `make nbval` runs them when torch imports, says it skipped them otherwise, and fails without
# torch when MHA_COURSE_REQUIRE_TORCH=1 (CI).
APPENDICES := $(wildcard notebooks/appendix_*.ipynb)
NOTEBOOKS := $(filter-out $(APPENDICES),$(wildcard notebooks/*.ipynb)) \
    $(wildcard notebooks/deep_dives/*.ipynb) $(wildcard solutions/*.ipynb)
NBVAL := -m pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
    -p no:cacheprovider

.PHONY: help lab app test lint unit nbval exercises notebook check assign grade bench clean-venv \
    nbgrader

help:
	@echo "make lab    set up .venv and open the course in JupyterLab (127.0.0.1, token auth)"
	@echo "make app    the four widgets on one page, for a projector (Voila; Ctrl-C stops it)"
	@echo "make test   set up .venv with the test extras and run every test"
	@echo "make check EX=03   check your my-work/exercises/03_*.ipynb against the solutions"
	@echo "make exercises     regenerate exercises/ from solutions/"
	@echo "make assign IDS=\"3.1 3.2 4.5\" OUT=hw1.ipynb [TITLE=... DUE=2025-03-14 POINTS=04.5=4 FORCE=1]"
	@echo "make grade SUBMISSIONS=folder ASSIGNMENT=hw1.assignment.json [CSV=grades.csv FEEDBACK=dir]"
	@echo "make notebook NB=notebooks/05_x.ipynb   (maintainers) execute a notebook in place, tidied"
	@echo "make bench         run the benchmarks (needs the reference extra and nbgrader; ARGS=--quick)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamps re-run the install whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-app: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[app]'
	touch $@

# The test tools and the kernels extra (Triton and PyTorch), so that the Triton kernels' tests
# and lesson 07's deep dive run (tests/test_triton_flash.py).
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test,kernels]'
	touch $@

# JupyterLab opens my-work/, the learner's own copies of the lessons and exercises (made and kept
# up to date by `python -m mha_course workspace`, which never overwrites a copy you changed), so
# that what you run and save never conflicts with `git pull`.
lab: $(VENV)/.installed
	$(BIN)/python -m mha_course workspace
	$(BIN)/jupyter lab --ip=127.0.0.1 --port=$(PORT) $(ROOT_FLAG) \
	    --ServerApp.root_dir="$(CURDIR)/my-work" --LabApp.default_url=/lab/tree/notebooks

# The instructors' app: notebooks/app.ipynb served by Voila without its code cells, the four widgets
# in tabs. mha_course/widgets/voila_app holds Voila's settings (voila.json: 127.0.0.1 only, no
# retrying other ports, a Content-Security-Policy that keeps the page on this server) and the page
# template (Voila's, without its CDN links), found through JUPYTER_PATH. A fresh token at every start: the
# URL is printed. One kernel per visitor. Ctrl-C stops the server and its kernels.
APP_PORT ?= 8866
app: $(VENV)/.installed-app
	JUPYTER_PATH="$(CURDIR)/mha_course/widgets/voila_app$(if $(JUPYTER_PATH),:$(JUPYTER_PATH))" \
	$(BIN)/voila notebooks/app.ipynb --Voila.config_file_paths="$(CURDIR)/mha_course/widgets/voila_app" \
	    --port=$(APP_PORT) --token --Voila.log_level=INFO

# nbgrader, for the nbgrader export's tests (tests/test_export_nbgrader.py): in an environment of its
# own, so that its JupyterLab extensions stay out of `make lab`. It borrows .venv's packages (a .pth
# file), so only nbgrader and what it adds are installed. `make test` skips those tests without it,
# unless MHA_COURSE_REQUIRE_NBGRADER=1 (CI).
NBGRADER_VENV := .venv-nbgrader
NBGRADER_VERSION := 0.9.6
nbgrader: $(NBGRADER_VENV)/bin/nbgrader
$(NBGRADER_VENV)/bin/nbgrader: $(VENV)/.installed-test
	$(BIN)/python -m venv $(NBGRADER_VENV)
	$(NBGRADER_VENV)/bin/python -c "import sysconfig; open(sysconfig.get_path('purelib') + '/mha-course-venv.pth', 'w').write('import site; site.addsitedir(%r)\n' % '$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')"
	$(NBGRADER_VENV)/bin/python -m pip install -q nbgrader==$(NBGRADER_VERSION)
	touch $@

# ruff lints the notebooks' code cells too (lessons, solutions, generated exercises).
lint: $(VENV)/.installed-test
	$(BIN)/ruff check mha_course tests benchmarks notebooks solutions exercises

unit: $(VENV)/.installed-test
	$(BIN)/python -m pytest --doctest-modules mha_course tests

# Strict nbval: every output of every lesson and solution notebook is compared.
nbval: $(VENV)/.installed-test
	$(if $(NOTEBOOKS),$(BIN)/python $(NBVAL) $(NOTEBOOKS),@echo "no notebooks yet")
	@if [ -n "$(APPENDICES)" ]; then \
	    if $(BIN)/python -c "import torch" 2>/dev/null; then \
	        $(BIN)/python $(NBVAL) $(APPENDICES); \
	    elif [ "$$MHA_COURSE_REQUIRE_TORCH" = 1 ]; then \
	        echo "PyTorch is not installed, and MHA_COURSE_REQUIRE_TORCH=1: cannot run $(APPENDICES)"; exit 1; \
	    else \
	        echo "skipped $(APPENDICES): they need PyTorch (pip install -e '.[reference]')"; \
	    fi; \
	fi

test: lint unit nbval

exercises: $(VENV)/.installed
	$(BIN)/python -m mha_course generate

# Maintainers: run a lesson or solution notebook top to bottom in a fresh kernel, save its outputs,
# then tidy it (kernelspec, no timing metadata, no widget state, nbval markers as tags).
notebook: $(VENV)/.installed-test
	$(if $(NB),,$(error pass NB=path/to/notebook.ipynb))
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.record_timing=False --ExecutePreprocessor.store_widget_state=False \
	    --ExecutePreprocessor.timeout=600 $(NB)
	$(BIN)/python -m mha_course tidy $(NB)

# The report says what passed; `|| true` keeps make from adding its own "Error 1" line under it
# (scripts that need the exit code run `python -m mha_course check --lesson NN` directly).
check: $(VENV)/.installed
	@$(BIN)/python -m mha_course check --lesson "$(EX)" || true

# make assign IDS="3.1 3.2 4.5" OUT=homework1.ipynb  writes homework1.ipynb and, beside it,
# homework1.assignment.json (refuses to overwrite them unless FORCE=1). TITLE, DUE (ISO 8601)
# and POINTS ("04.5=4,03.1=2"; default: the stars) are optional.
assign: $(VENV)/.installed
	$(BIN)/python -m mha_course assign $(IDS) -o $(or $(OUT),$(error pass OUT=file.ipynb)) \
	    $(if $(TITLE),--title "$(TITLE)") $(if $(DUE),--due "$(DUE)") \
	    $(if $(POINTS),--points "$(POINTS)") $(if $(filter 1,$(FORCE)),--force)

# make grade SUBMISSIONS=downloads/week2 ASSIGNMENT=homework1.assignment.json: every submission
# graded against the assignment, 2 at a time; the gradebook CSV (default results.csv, a new name
# if it exists) and, with FEEDBACK=dir, one feedback file per student. ARGS passes more options
# (--roster roster.csv --deadline --excel --timeout 60). Exit code: 0 graded, 1 some submission
# unreadable, 2 a usage error (see `python -m mha_course check --help`).
grade: $(VENV)/.installed
	$(BIN)/python -m mha_course check "$(or $(SUBMISSIONS),$(error pass SUBMISSIONS=folder))" \
	    --assignment "$(or $(ASSIGNMENT),$(error pass ASSIGNMENT=file.assignment.json))" \
	    --jobs $(or $(JOBS),2) $(if $(CSV),--csv "$(CSV)") \
	    $(if $(FEEDBACK),--feedback "$(FEEDBACK)") $(ARGS)

# Benchmarks print ratios measured in one run; they are not tests. Needs the reference extra;
# benchmarks/grading.py grades one class with the checker and with nbgrader (make nbgrader).
bench: $(VENV)/.installed-test $(NBGRADER_VENV)/bin/nbgrader
	$(BIN)/python benchmarks/attention.py $(ARGS)
	$(BIN)/python benchmarks/tiled.py $(ARGS)
	$(BIN)/python benchmarks/kv_cache.py $(ARGS)
	$(BIN)/python benchmarks/gpt.py $(ARGS)
	$(BIN)/python benchmarks/explorer_redraw.py
	$(BIN)/python benchmarks/grading.py $(ARGS)
	$(BIN)/python benchmarks/triton_flash.py $(if $(filter --quick,$(ARGS)),--quick,)

clean-venv:
	rm -rf $(VENV)
