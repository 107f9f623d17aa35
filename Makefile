# flash-stages: GNU make.
#
#   make                  every stage program build/<stage> and build/cublas, and each Hopper
#                         stage's PTX, build/<stage>.ptx (the static check reads it)
#   make build/03_tiled   one stage (build/<stage>.ptxas.log gets ptxas' register/spill report)
#   make build/03_tiled BR=32 BC=128   stage 3 (and 4, BR only) with other tile sizes; make
#                         again without them to go back (the objects remember the knobs)
#   make build/08_fa3 TRACE=1   a warp-specialised stage able to record its pipeline's timeline
#                         (ATTN_TRACE=FILE; common/trace.cuh)
#   make build/08_fa3 OFF=pingpong,overlap   a Hopper stage with ideas built out (its header
#                         lists its knobs; make again without OFF to go back)
#   make test             static check + Criterion tests (GPU tests skip without a GPU)
#   make sanitize         compute-sanitizer memcheck/racecheck/initcheck/synccheck (GPU)
#   make bench / plots    plots/bench.sh (the sweep, long context, masks; then PART=hopper: the
#                         Hopper stages at d = 64, 128, 256, and the e4m3 forward of those that
#                         have one beside cuDNN's; then plots/fp8_rmse.sh, the e4m3 forward's
#                         RMSE) and plots/bytes.sh (GPU);
#                         plots/plots.sh. make bench PART=sweep|long|masks|hopper: that part
#                         alone, its CSV replaced whole
#   make bytes            plots/bytes.sh: Nsight Compute's DRAM bytes per stage (GPU)
#   make ablation         plots/ablation.sh: stages 8 to 11 with each of their ideas built out
#                         (build/ablation/), checked and timed (GPU)
#   make profile STAGE=n [ARGS="..."]   plots/profile.sh: Nsight Compute's time, DRAM bytes,
#                         occupancy, tensor pipe and stall reasons of stage n, one table (GPU)
#   make diff STAGE=n     what stage n changes relative to its parent (the stage its header
#                         names after "Changed from"; stage n-1 if it names none), and the
#                         common/ definitions it uses first (plots/stage_diff.sh)
#   make deps             Criterion (tests) and gnuplot (plots); deps-local: Criterion into .deps/
#   make clean
#
# Criterion is taken from .deps/ when .deps/usr/include/criterion exists (make deps-local puts
# it there, for machines without network), else from the system.

SHELL := /bin/bash
.DEFAULT_GOAL := all

NVCC      ?= nvcc
NVCC_PATH := $(shell command -v $(NVCC) 2>/dev/null)
CUDA_HOME ?= $(if $(NVCC_PATH),$(patsubst %/bin/nvcc,%,$(realpath $(NVCC_PATH))),/usr/local/cuda)
CC        := gcc
CXX       := g++
BUILD     ?= build
STAGES_DIR ?= stages
OBJ       := $(BUILD)/obj

STAGES := $(sort $(patsubst $(STAGES_DIR)/%/attention.cu,%,$(wildcard $(STAGES_DIR)/*/attention.cu)))
CUBLAS_SRC := $(wildcard common/cublas_baseline.cu)
PROGRAMS := $(addprefix $(BUILD)/,$(STAGES)) $(if $(CUBLAS_SRC),$(BUILD)/cublas)

GENCODE := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
           -gencode arch=compute_80,code=compute_80
NVFLAGS := -O3 -std=c++17 -lineinfo -Icommon $(GENCODE)
# Stages that include common/hopper.cuh use wgmma and setmaxnreg: arch-specific sm_90a code only
# (it runs on compute capability 9.0 and nothing else; their check() says so elsewhere).
HOPPER_STAGES := $(patsubst $(STAGES_DIR)/%/attention.cu,%,$(shell grep -l '^\#include "hopper.cuh"' $(STAGES_DIR)/*/attention.cu 2>/dev/null))
NVFLAGS_HOPPER := -O3 -std=c++17 -lineinfo -Icommon -gencode arch=compute_90a,code=sm_90a
HOPPER_PTX := $(patsubst %,$(BUILD)/%.ptx,$(HOPPER_STAGES))
CFLAGS  := -std=c11 -O2 -g -Wall -Wextra -Wno-format-truncation -D_POSIX_C_SOURCE=200809L \
           -Icommon -I$(CUDA_HOME)/include -pthread
# cudart linked statically: the programs run wherever the driver is, whatever the loader path
LDLIBS  := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lm
CUBLAS_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas

DEV_HDRS := common/attn.h common/attn_device.cuh $(wildcard common/mma.cuh common/mma_tiles.cuh common/hopper.cuh common/trace.cuh)
LIB_SRCS := $(filter-out common/main.c,$(wildcard common/*.c))
LIB_OBJS := $(patsubst common/%.c,$(OBJ)/lib_%.o,$(LIB_SRCS))
LIB      := $(BUILD)/libharness.a
HOST_HDRS := common/attn.h common/harness.h

# Criterion: .deps/ first, then the system
DEPS_LIB  := .deps/usr/lib/x86_64-linux-gnu
DEPS_LIB2 := .deps/lib/x86_64-linux-gnu
DEPS_LD_PATH := $(CURDIR)/$(DEPS_LIB):$(CURDIR)/$(DEPS_LIB2)
ifneq ($(wildcard .deps/usr/include/criterion/criterion.h),)
CRIT_CFLAGS := -I.deps/usr/include
# DT_RPATH (not RUNPATH) so that it also serves Criterion's own dependencies
CRIT_LIBS   := -L$(DEPS_LIB) -Wl,-rpath-link,$(DEPS_LIB):$(DEPS_LIB2) -Wl,--disable-new-dtags \
               -Wl,-rpath,'$$ORIGIN/../$(DEPS_LIB):$$ORIGIN/../$(DEPS_LIB2)' -lcriterion
else
CRIT_CFLAGS :=
CRIT_LIBS   := -lcriterion
endif
TEST_SRCS := $(wildcard tests/*.c)
TEST_OBJS := $(patsubst tests/%.c,$(OBJ)/test_%.o,$(TEST_SRCS))
TEST_BIN  := $(BUILD)/test_all
STAGE_OBJS := $(patsubst %,$(OBJ)/%.stage.o,$(STAGES)) $(if $(CUBLAS_SRC),$(OBJ)/cublas.stage.o)
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all test test-run static-check sanitize bench bytes ablation profile plots diff clean deps deps-test \
        deps-plot deps-local deps-local-plot FORCE
.SECONDARY:

all: $(PROGRAMS) $(HOPPER_PTX)

$(OBJ):
	@mkdir -p $@

# ---- the harness library ------------------------------------------------------------
$(OBJ)/lib_%.o: common/%.c $(HOST_HDRS) | $(OBJ)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

# ---- knobs: BR and BC (tile sizes) reach the stages whose source reads them (#ifndef BR); TRACE
# (the pipeline's timeline) those that include trace.cuh; OFF=a,b (ideas built out for an
# ablation: -DA=0 -DB=0) those with "#ifndef A   /* knob: ..." lines. The file build/knobs
# changes only when the knobs do, and those stages are rebuilt then ------------------------
comma := ,
KNOBS := $(strip $(if $(BR),-DBR=$(BR)) $(if $(BC),-DBC=$(BC)) $(if $(TRACE),-DTRACE=1) \
           $(foreach k,$(subst $(comma), ,$(OFF)),-D$(shell echo '$(k)' | tr a-z A-Z)=0))
KNOB_STAGES := $(patsubst $(STAGES_DIR)/%/attention.cu,%,$(shell grep -l '^\#ifndef BR\|^\#ifndef [A-Z_]* *.. knob:\|^\#include "trace.cuh"' $(STAGES_DIR)/*/attention.cu 2>/dev/null))
$(BUILD)/knobs: FORCE | $(OBJ)
	@echo '$(KNOBS)' > $@.tmp; if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(patsubst %,$(OBJ)/%.stage.o,$(KNOB_STAGES)): $(BUILD)/knobs

# ---- stages: object (ptxas report kept), main with the stage's symbol, program ---------
$(OBJ)/%.stage.o: $(STAGES_DIR)/%/attention.cu $(DEV_HDRS) | $(OBJ)
	@echo "nvcc $< -> $@ (ptxas report: $(BUILD)/$*.ptxas.log)$(if $(filter $*,$(KNOB_STAGES)),$(if $(KNOBS), $(KNOBS)))"
	@$(NVCC) $(if $(filter $*,$(HOPPER_STAGES)),$(NVFLAGS_HOPPER),$(NVFLAGS)) $(if $(filter $*,$(KNOB_STAGES)),$(KNOBS)) \
	  -Xptxas -v -c $< -o $@ 2> $(BUILD)/$*.ptxas.log || \
	  { cat $(BUILD)/$*.ptxas.log; rm -f $@; exit 1; }
	@grep -v '^ptxas info\|^    [0-9]* bytes stack frame' $(BUILD)/$*.ptxas.log || true

# the PTX of a Hopper stage, which tests/static_check.sh reads (its object holds SASS only)
$(HOPPER_PTX): $(BUILD)/%.ptx: $(STAGES_DIR)/%/attention.cu $(DEV_HDRS) | $(OBJ)
	@echo "nvcc -ptx $< -> $@"
	@$(NVCC) $(NVFLAGS_HOPPER) -ptx $< -o $@

$(OBJ)/cublas.stage.o: common/cublas_baseline.cu $(DEV_HDRS) | $(OBJ)
	@echo "nvcc $< -> $@ (ptxas report: $(BUILD)/cublas.ptxas.log)"
	@$(NVCC) $(NVFLAGS) -Xptxas -v -c $< -o $@ 2> $(BUILD)/cublas.ptxas.log || \
	  { cat $(BUILD)/cublas.ptxas.log; rm -f $@; exit 1; }
	@grep -v '^ptxas info\|^    [0-9]* bytes stack frame' $(BUILD)/cublas.ptxas.log || true

$(OBJ)/%.main.o: common/main.c $(HOST_HDRS) | $(OBJ)
	$(CC) $(CFLAGS) -DATTN_STAGE=stage_$* -c $< -o $@

$(addprefix $(BUILD)/,$(STAGES)): $(BUILD)/%: $(OBJ)/%.stage.o $(OBJ)/%.main.o $(LIB)
	$(CXX) -o $@ $^ $(LDLIBS)

$(BUILD)/cublas: $(OBJ)/cublas.stage.o $(OBJ)/cublas.main.o $(LIB)
	$(CXX) -o $@ $^ $(CUBLAS_LIBS) $(LDLIBS)

# ---- the list of stages the tests iterate over (rewritten only when it changes) --------
$(BUILD)/stage_list.c: FORCE | $(OBJ)
	@{ echo '/* generated by the Makefile: every stage under $(STAGES_DIR)/, in order */'; \
	   echo '#include <stddef.h>'; echo '#include "attn.h"'; \
	   for s in $(STAGES); do echo "extern const attn_stage stage_$$s;"; done; \
	   $(if $(CUBLAS_SRC),echo 'extern const attn_stage stage_cublas;';) \
	   echo 'const attn_stage *const attn_stages[] = {'; \
	   for s in $(STAGES); do echo "    &stage_$$s,"; done; \
	   echo '    NULL };'; \
	   echo 'const int attn_nstages = $(words $(STAGES));'; \
	   echo '/* the cuBLAS baseline (not on the ladder); NULL when not built */'; \
	   echo 'const attn_stage *const attn_baseline = $(if $(CUBLAS_SRC),&stage_cublas,NULL);'; \
	 } > $@.tmp; if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

$(OBJ)/stage_list.o: $(BUILD)/stage_list.c common/attn.h | $(OBJ)
	$(CC) $(CFLAGS) -c $< -o $@

# ---- tests ---------------------------------------------------------------------------
$(OBJ)/test_%.o: tests/%.c $(HOST_HDRS) $(wildcard tests/*.h) | $(OBJ)
	$(CC) $(CFLAGS) $(CRIT_CFLAGS) -c $< -o $@

$(TEST_BIN): $(TEST_OBJS) $(OBJ)/stage_list.o $(STAGE_OBJS) $(LIB)
	$(CXX) -o $@ $^ $(CRIT_LIBS) $(if $(CUBLAS_SRC),$(CUBLAS_LIBS)) $(LDLIBS)

# deps first in a make of its own, so this make's view of .deps/ is current
test:
	@$(MAKE) --no-print-directory deps-test
	@$(MAKE) --no-print-directory test-run

# a deadlock of a Hopper pipeline ends in an error (the GPU tests run it)
$(BUILD)/hopper_deadlock: tests/hopper_deadlock.cu $(DEV_HDRS) | $(OBJ)
	$(NVCC) $(NVFLAGS_HOPPER) -o $@ $<

# the layouts the fp8 stage assumes, on one warpgroup (the GPU tests run it); it includes the
# stage's file, to test its own transpose and packing
FP8_STAGE := $(firstword $(wildcard $(STAGES_DIR)/11_fp8/attention.cu))
$(BUILD)/fp8_layout: tests/fp8_layout.cu $(FP8_STAGE) $(DEV_HDRS) $(LIB) | $(OBJ)
	$(NVCC) $(NVFLAGS_HOPPER) -o $@ $< $(LIB) -lm

test-run: all $(TEST_BIN) $(BUILD)/hopper_deadlock $(if $(FP8_STAGE),$(BUILD)/fp8_layout)
	sh tests/static_check.sh $(BUILD) $(STAGES) $(if $(CUBLAS_SRC),cublas)
	LD_LIBRARY_PATH=$(DEPS_LD_PATH)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} ATTN_BUILD=$(BUILD) \
	  $(TEST_BIN) --jobs $(TEST_JOBS) $(TEST_ARGS)

static-check: all
	sh tests/static_check.sh $(BUILD) $(STAGES) $(if $(CUBLAS_SRC),cublas)

# ---- compute-sanitizer over every stage, forward and backward, small odd shapes ---------
SANITIZER ?= $(if $(wildcard $(CUDA_HOME)/bin/compute-sanitizer),$(CUDA_HOME)/bin/compute-sanitizer,compute-sanitizer)
sanitize: all
	bash tests/sanitize.sh $(SANITIZER) $(BUILD) $(STAGES) $(if $(CUBLAS_SRC),cublas)

# ---- benchmarks and plots (scripts owned by plots/) ----------------------------------
bench: all
ifeq ($(PART),hopper)
	PART=hopper STAGES="06_fa2 $(HOPPER_STAGES) torch" sh plots/bench.sh
	$(if $(FP8_STAGE),sh plots/fp8_rmse.sh)
else ifneq ($(PART),)
	PART=$(PART) sh plots/bench.sh
else
	@t0=$$(date +%s); \
	sh plots/bench.sh && \
	PART=hopper STAGES="06_fa2 $(HOPPER_STAGES) torch" sh plots/bench.sh && \
	$(if $(FP8_STAGE),sh plots/fp8_rmse.sh &&) \
	{ sh plots/bytes.sh || echo "bench: no DRAM byte counts (plots/bytes.sh, above, says why)"; }; \
	rc=$$?; t=$$(( $$(date +%s) - t0 )); \
	echo "bench: $$([ $$rc = 0 ] && echo 'every part' || echo 'stopped by a failure') after $$((t / 60)) min $$((t % 60)) s"; \
	exit $$rc
endif

bytes: all
	sh plots/bytes.sh

ablation: all
	BUILD_DIR=$(BUILD) sh plots/ablation.sh

profile: all
	@[ -n "$(STAGE)" ] || { echo "usage: make profile STAGE=n [ARGS=\"--seqlen 8192 --dim 128 ...\"]"; exit 2; }
	sh plots/profile.sh $(STAGE) $(ARGS)

# make plots GPU=NVIDIA-H200 draws plots/results/NVIDIA-H200*.csv; without GPU=, the one GPU
# with CSVs there (with several, plots/plots.sh lists them and stops)
plots: deps-plot
	PATH=$(CURDIR)/.deps/usr/bin:$$PATH GPU='$(GPU)' \
	LD_LIBRARY_PATH=$(DEPS_LD_PATH)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} sh plots/plots.sh

# ---- the lesson of stage n: its diff against its parent ----------------------------------
diff:
	@[ -n "$(STAGE)" ] || { echo "usage: make diff STAGE=n   (n >= 2)"; exit 2; }
	@STAGES_DIR=$(STAGES_DIR) sh plots/stage_diff.sh $(STAGE)

clean:
	rm -rf $(BUILD)

# ---- dependencies ------------------------------------------------------------------------
# Criterion: found (.deps/ or system) -> nothing; root with apt-get -> apt-get install;
# otherwise the .debs are extracted into .deps/ (make deps-local).
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q
deps: deps-test deps-plot

deps-test:
	@if [ -f .deps/usr/include/criterion/criterion.h ]; then echo "Criterion: .deps/"; exit 0; fi; \
	if [ -f /usr/include/criterion/criterion.h ]; then echo "Criterion: system"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "Criterion: apt-get install libcriterion-dev"; \
	  { $(APT_INSTALL) libcriterion-dev || { apt-get update -q && $(APT_INSTALL) libcriterion-dev; }; } \
	    && [ -f /usr/include/criterion/criterion.h ] && exit 0; \
	fi; \
	$(MAKE) --no-print-directory deps-local

# the runtime closure of libcriterion3 (less the C library itself), plus the headers
DEPS_EXCLUDE := ^(libc6|libgcc-s1|gcc-[0-9]+-base|debconf)$$
define extract_debs
	set -e; mkdir -p .deps/debs; cd .deps/debs; rm -f *.deb; \
	pkgs="$$( { apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
	    --no-breaks --no-replaces --no-enhances $(1) || true; } | grep -E '^[a-z0-9]' | \
	    grep -Ev '$(DEPS_EXCLUDE)' | sort -u)"; \
	if [ -z "$$pkgs" ]; then apt-get update -q >/dev/null; \
	  pkgs="$$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
	    --no-breaks --no-replaces --no-enhances $(1) | grep -E '^[a-z0-9]' | \
	    grep -Ev '$(DEPS_EXCLUDE)' | sort -u)"; fi; \
	echo "extracting into .deps/: $(2) $$pkgs" | tr '\n' ' '; echo; \
	apt-get download $(2) $$pkgs 2>/dev/null || { apt-get update -q >/dev/null; apt-get download $(2) $$pkgs; }; \
	for f in *.deb; do dpkg -x $$f ..; done; rm -f *.deb
endef

deps-local:
	@$(call extract_debs,libcriterion3,libcriterion-dev)
	@[ -f .deps/usr/include/criterion/criterion.h ] && echo "Criterion extracted into .deps/"

# gnuplot for make plots
deps-plot:
	@if command -v gnuplot >/dev/null || [ -x .deps/usr/bin/gnuplot ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  { $(APT_INSTALL) gnuplot-nox || { apt-get update -q && $(APT_INSTALL) gnuplot-nox; }; } \
	    && command -v gnuplot >/dev/null && exit 0; \
	fi; \
	$(MAKE) --no-print-directory deps-local-plot

deps-local-plot:
	@$(call extract_debs,gnuplot-nox,)
	@ln -sf gnuplot-nox .deps/usr/bin/gnuplot && echo "gnuplot extracted into .deps/usr/bin"

FORCE:
