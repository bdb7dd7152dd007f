# kinfer - hand-written GNU Make. `make` builds build/kinfer; `make test`
# installs missing Debian packages, builds and runs every test; `make demo`
# runs the worker end to end on its embedded defaults.

CC      ?= gcc
# CUDA: the toolkit's own directory first; an nvcc found on PATH (which may
# be a wrapper script) is used only with a toolkit whose static runtime we
# can find, so a partial install never breaks the CPU build.
CUDA_HOME ?= /usr/local/cuda
NVCC    ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDART_A := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart_static.a \
              $(CUDA_HOME)/lib/libcudart_static.a \
              $(CUDA_HOME)/targets/*-linux/lib/libcudart_static.a))
PKGS    := rdkafka hiredis msgpack libconfig jansson openblas libmicrohttpd libutf8proc libpcre2-8
VERSION := 0.1.0

# Debian 12 packages the build needs (make deps-build installs them: the
# container images), and those the tests and demo need besides (make deps
# installs both lists).
BUILD_DEB_PKGS := gcc make pkg-config librdkafka-dev libhiredis-dev libmsgpack-dev \
            libconfig-dev libopenblas-dev libjansson-dev libmicrohttpd-dev \
            libutf8proc-dev libpcre2-dev
TEST_DEB_PKGS := libcmocka-dev redis-server kafkacat curl prometheus python3-yaml python3-torch
DEB_PKGS := $(BUILD_DEB_PKGS) $(TEST_DEB_PKGS)

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2
ifeq ($(WERROR),1)
WARN    += -Werror
endif
OPT     ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -pthread $(OPT) $(WARN) -MMD -MP \
           -DKINFER_VERSION='"$(VERSION)"' $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm -pthread

ifeq ($(SANITIZE),address)
CFLAGS  += -fsanitize=address -fno-omit-frame-pointer
LDFLAGS += -fsanitize=address
endif
ifeq ($(SANITIZE),undefined)
CFLAGS  += -fsanitize=undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=undefined
endif
ifeq ($(SANITIZE),thread)
CFLAGS  += -fsanitize=thread
LDFLAGS += -fsanitize=thread
endif

# An instrumented build gets a tree of its own, so plain and sanitized
# objects never mix; the tests are told which kinfer binary to run.
ifeq ($(SANITIZE),)
B ?= build
else
B ?= build-$(SANITIZE)
endif
# The CUDA backend (gpu/backend_cuda.c, gpu/cuda_lt.c, gpu/cuda_prims.c and
# the kernels, gpu/*.cu) compiles wherever nvcc and the runtime exist;
# elsewhere gpu/cuda_stub.c stands in and says "not built with CUDA". The
# CPU path never needs CUDA, and only those gpu/ files see its headers.
ifneq ($(NVCC),)
ifeq ($(CUDART_A),)
$(warning nvcc found ($(NVCC)) but no libcudart_static.a under CUDA_HOME=$(CUDA_HOME); building without CUDA)
NVCC :=
endif
endif
CUDA_C_SRCS := gpu/backend_cuda.c $(filter-out gpu/cuda_stub.c,$(wildcard gpu/cuda_*.c))
GPU_SRCS := $(filter-out $(CUDA_C_SRCS) gpu/cuda_stub.c,$(wildcard gpu/*.c))
ifneq ($(NVCC),)
GPU_SRCS  += $(CUDA_C_SRCS)
CU_SRCS   := $(wildcard gpu/*.cu)
CU_OBJS   := $(CU_SRCS:%.cu=$(B)/%.cu.o)
CUDA_LIBDIR := $(firstword $(dir $(CUDART_A)))
# cuBLASLt is loaded when the CUDA backend opens (dlopen), found through
# the loader's path or this run path; a CPU-only run never loads it.
LDLIBS    += -Wl,-rpath,$(CUDA_LIBDIR) $(CUDART_A) -lstdc++ -ldl -lrt
# Machine code for Ampere (sm_80) and Hopper (sm_90), and PTX the driver
# can compile for anything from Turing (7.5, the oldest CUDA 13 supports).
CUDA_ARCHS ?= -gencode arch=compute_75,code=compute_75 -gencode arch=compute_80,code=sm_80 \
              -gencode arch=compute_90,code=sm_90
NVFLAGS   := -O2 -std=c++17 $(CUDA_ARCHS) -Xcompiler -Wall,-Wextra,-fPIC
$(CUDA_C_SRCS:%.c=$(B)/%.o): CFLAGS += -isystem $(CUDA_HOME)/include
else
GPU_SRCS  += gpu/cuda_stub.c
endif

LIB_SRCS := $(wildcard base/*.c) $(wildcard codecs/*.c) $(wildcard config/*.c) $(wildcard kafka/*.c) $(GPU_SRCS) $(wildcard batching/*.c) $(wildcard text/*.c) $(wildcard gen/*.c) \
            $(wildcard worker/*.c) $(wildcard telemetry/*.c) $(wildcard tools/*.c) \
            $(filter-out cmd/main.c,$(wildcard cmd/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/%.o)

TEST_SRCS := $(wildcard tests/test_*.c)
TESTS     := $(TEST_SRCS:tests/%.c=$(B)/tests/%)
# The emulated device (emu/) is never linked into kinfer: its
# objects go only into its own tests and into test programs of their own
# that run the CUDA backend on it (build/emu/tests/), which make test runs
# wherever CUDA's headers are (emu/ is written against them). gpu/'s CUDA
# C files are built again with KINFER_EMU (cuBLASLt is then found in the
# program), and the kernels (gpu/*.cu, launches rewritten from <<<...>>>
# to EMU_LAUNCH) by the host's C++ compiler over emu/emu_kernel.h.
EMU_CXX      ?= g++
EMU_CXXFLAGS := -std=c++17 $(OPT) -Wall -Wextra $(if $(filter 1,$(WERROR)),-Werror) -MMD -MP \
                -isystem $(CUDA_HOME)/include \
                $(filter -fsanitize=% -fno-omit-frame-pointer -fno-sanitize-recover=%,$(CFLAGS))
EMU_LT_OBJS  := $(B)/emu/emu_lt.o
EMU_RT_OBJS  := $(B)/emu/emu_rt.o
EMU_KERNEL_OBJS := $(B)/emu/emu_kernel.o
EMU_GPU_OBJS := $(CUDA_C_SRCS:%.c=$(B)/emu/%.o) $(patsubst %.cu,$(B)/emu/%.emu.o,$(wildcard gpu/*.cu))
EMU_DEV_OBJS := $(EMU_GPU_OBJS) $(EMU_RT_OBJS) $(EMU_LT_OBJS) $(EMU_KERNEL_OBJS)
EMU_LIB_OBJS := $(filter-out $(CUDA_C_SRCS:%.c=$(B)/%.o) $(B)/gpu/cuda_stub.o,$(LIB_OBJS))
EMU_LDLIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm -pthread -lstdc++ -ldl -lrt
# The CUDA backend's tests that run on the emulated device in make test.
EMU_GPU_TESTS := $(B)/emu/tests/test_cuda_prims $(B)/emu/tests/test_cuda_sample \
                 $(B)/emu/tests/test_gpu \
                 $(B)/emu/tests/test_arch_encoders $(B)/emu/tests/test_arch_nomic \
                 $(B)/emu/tests/test_decoder $(B)/emu/tests/test_gen_engine \
                 $(B)/emu/tests/test_precision
# Scripts make test runs after the programs: the worker end to end on the
# emulated device (tests/emu_e2e.sh: test_text_jobs and kinfer smoke
# against $(B)/emu/kinfer) and the bugs it must catch (tests/emu_bugs.sh).
EMU_SCRIPTS  := tests/emu_e2e.sh tests/emu_bugs.sh
ifneq ($(wildcard $(CUDA_HOME)/include/cublasLt.h),)
$(B)/emu/%.o: CFLAGS += -isystem $(CUDA_HOME)/include
# Kernel threads run on stacks of their own, switched by hand:
# AddressSanitizer is told of each switch (emu/emu_kernel.cc) and runs the
# primitives' emulated test too (the whole list would take it minutes);
# the other sanitizers do not follow the switches, and run without the
# execution model's tests.
ifeq ($(SANITIZE),)
TESTS     += $(EMU_GPU_TESTS)
TEST_SCRIPTS += $(EMU_SCRIPTS)
TEST_BUILDS  += $(B)/emu/kinfer
else ifeq ($(SANITIZE),address)
TESTS     += $(B)/emu/tests/test_cuda_prims
else
TESTS     := $(filter-out $(B)/tests/test_emu_kernel,$(TESTS))
endif
else
TESTS     := $(filter-out $(B)/tests/test_emu_%,$(TESTS))
endif
# The fault suite (minutes): make test-faults.
FAULT_SRCS := $(wildcard tests/faults_*.c)
FAULT_TESTS := $(FAULT_SRCS:tests/%.c=$(B)/tests/%)

.PHONY: all deps test test-faults test-gpu demo fuzz clean emu
all: $(B)/kinfer

$(B)/kinfer: $(B)/cmd/main.o $(LIB_OBJS) $(CU_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(B)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(B)/tests/%: tests/%.c $(LIB_OBJS) $(CU_OBJS) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(CU_OBJS) $(LDLIBS) -lcmocka

$(B)/emu/%.o: emu/%.cc
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -c -o $@ $<

$(B)/emu/gpu/%.o: gpu/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -isystem $(CUDA_HOME)/include -DKINFER_EMU -c -o $@ $<

$(B)/emu/%.emu.cu: %.cu
	@mkdir -p $(dir $@)
	sed -E 's/([A-Za-z_][A-Za-z_0-9]*)<<<([^>]*)>>>/EMU_LAUNCH(\1, \2)/' $< > $@

$(B)/emu/%.emu.o: $(B)/emu/%.emu.cu emu/emu_kernel.h
	$(EMU_CXX) $(EMU_CXXFLAGS) -I$(dir $*) -x c++ -include emu/emu_kernel.h -c -o $@ $<

$(B)/tests/test_emu_lt: tests/test_emu_lt.c $(EMU_LT_OBJS) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -isystem $(CUDA_HOME)/include $(LDFLAGS) -o $@ $< $(EMU_LT_OBJS) \
	  $(LDLIBS) -lcmocka

$(B)/tests/test_emu_rt: tests/test_emu_rt.c $(EMU_RT_OBJS) $(EMU_LT_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -isystem $(CUDA_HOME)/include $(LDFLAGS) -o $@ $< $(EMU_RT_OBJS) \
	  $(EMU_LT_OBJS) -lm -pthread -lcmocka

$(B)/tests/test_emu_kernel: tests/test_emu_kernel.c $(B)/emu/tests/emu_kernels.emu.o \
                            $(EMU_KERNEL_OBJS) $(EMU_RT_OBJS) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -isystem $(CUDA_HOME)/include $(LDFLAGS) -o $@ $< \
	  $(B)/emu/tests/emu_kernels.emu.o $(EMU_KERNEL_OBJS) $(EMU_RT_OBJS) -lstdc++ -lm -pthread \
	  -lcmocka

# make emu: kinfer whose CUDA backend runs on the emulated device
# (worker.backend = "cuda" on a machine without a GPU); never installed.
emu: $(B)/emu/kinfer

$(B)/emu/kinfer: $(B)/cmd/main.o $(EMU_LIB_OBJS) $(EMU_DEV_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $^ $(EMU_LDLIBS)

# A test program of the CUDA backend, on the emulated device: cuBLASLt's
# symbols are exported (-rdynamic) for gpu/cuda_lt.c's dlopen(NULL).
# KINFER_EMU tells a test it runs there (test_arch_encoders then runs
# only its CUDA test, test_gpu fewer random encoder batches).
$(B)/emu/tests/%: tests/%.c $(EMU_LIB_OBJS) $(EMU_DEV_OBJS) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKINFER_EMU $(LDFLAGS) -rdynamic -o $@ $< $(EMU_LIB_OBJS) $(EMU_DEV_OBJS) \
	  $(EMU_LDLIBS) -lcmocka

# Installs whatever Debian package is missing (needs root, or sudo);
# deps-build only what building build/kinfer takes.
.PHONY: deps-build
deps-build:
	@$(MAKE) --no-print-directory deps DEB_PKGS="$(BUILD_DEB_PKGS)"

deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

# tests/layers.sh checks the tree's shape: the folders include one way
# (no cycle) and no source file outgrows 900 lines.
test: deps
	$(MAKE) $(B)/kinfer $(TESTS) $(TEST_BUILDS)
	KINFER_BIN=$(B)/kinfer tests/run.sh tests/layers.sh $(TESTS) $(TEST_SCRIPTS)

test-faults: deps
	$(MAKE) $(B)/kinfer $(FAULT_TESTS)
	KINFER_BIN=$(B)/kinfer tests/run.sh $(FAULT_TESTS)

# The CUDA backend's tests alone (make test runs them too; without a
# device they print "skipped: no CUDA device").
test-gpu: deps
	$(MAKE) $(B)/kinfer $(B)/tests/test_gpu $(B)/tests/test_gpu_plan $(B)/tests/test_cuda_prims \
	  $(B)/tests/test_cuda_sample $(B)/tests/test_decoder $(B)/tests/test_gen_engine
	KINFER_BIN=$(B)/kinfer tests/run.sh $(B)/tests/test_gpu_plan $(B)/tests/test_cuda_prims \
	  $(B)/tests/test_cuda_sample $(B)/tests/test_gpu $(B)/tests/test_decoder
	KINFER_BIN=$(B)/kinfer KINFER_TEST_BACKEND=cuda tests/run.sh $(B)/tests/test_gen_engine

demo: deps
	$(MAKE) all
	tests/demo.sh

# The CPU container image, built and run: tests/docker-test.sh (needs a
# Docker engine; minutes). Not part of make test.
.PHONY: docker-test
docker-test:
	tests/docker-test.sh

# libFuzzer on the job decoder and result encoder, with ASan and UBSan:
# builds with clang, writes a seed corpus of valid and hostile jobs, runs
# FUZZ_RUNS executions (10^7 by default, a few minutes on one core).
FUZZ_RUNS ?= 10000000
FUZZ_PKGS := clang libclang-rt-14-dev
FUZZ_SRCS := codecs/codec_decode.c codecs/codec_payload.c codecs/codec_gen.c codecs/codec_encode.c codecs/gbuf.c codecs/mpscan.c codecs/protocol.c codecs/json_utf8.c base/utf8.c base/clock.c
fuzz:
	@missing=""; for p in $(FUZZ_PKGS) libmsgpack-dev libjansson-dev; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; fi
	@mkdir -p build-fuzz/corpus
	clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined $(shell pkg-config --cflags msgpack jansson) \
	  -o build-fuzz/fuzz_job tests/fuzz/fuzz_job.c $(FUZZ_SRCS) \
	  $(shell pkg-config --libs msgpack jansson) -lm
	$(CC) -std=c11 -D_GNU_SOURCE -O1 $(shell pkg-config --cflags msgpack jansson) \
	  -o build-fuzz/seeds tests/fuzz/seeds.c codecs/wire.c codecs/protocol.c \
	  $(shell pkg-config --libs msgpack jansson) -lm
	build-fuzz/seeds build-fuzz/corpus
	build-fuzz/fuzz_job -runs=$(FUZZ_RUNS) -max_len=65536 -rss_limit_mb=2048 \
	  -print_final_stats=1 build-fuzz/corpus

# make bench: an optimised, uninstrumented build of its own (build/bench),
# then bench/run.sh: kinfer against its floors, one table, a latency plot
# and docs/benchmarks.md updated (a few minutes on 2 cores). Not a test.
BENCH_PKGS := gnuplot-nox
.PHONY: bench
bench: deps
	@$(MAKE) --no-print-directory deps DEB_PKGS="$(BENCH_PKGS)"
	$(MAKE) SANITIZE= B=build/bench OPT='-O2 -g' build/bench/kinfer
	KINFER_BIN=build/bench/kinfer bench/run.sh

clean:
	rm -rf build-fuzz build build-address build-undefined build-thread

-include $(shell find $(B) -name '*.d' 2>/dev/null)
