"""Counting every byte torch's CPU allocator hands out, on every thread: a thin allocator in front of torch's own
(``c10::SetCPUAllocator``) that keeps the bytes live and their peak, as ``torch.cuda.memory_allocated`` and
``max_memory_allocated`` do on a GPU. torch has no such statistics for the CPU, and its profiler's memory events
only see threads the profiler runs on (not gloo's workers) and pair frees with allocations across profiling
windows (a tensor of an earlier window freed in this one counts against it), so `strategies.memory.measure`
measures with this.

The allocator is a few lines of C++ (below), built once per torch version with the system's C++ compiler into
``~/.cache/tandem`` (``TANDEM_CACHE`` to move it) and loaded with ctypes; it stays installed for the rest of the
process once a measurement asked for it (every CPU allocation then takes one lock; nothing else changes). A
window counts only what is allocated inside it: a tensor made before the window and freed inside it does not
lower the count.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading

import torch

from tandem_core.errors import ConfigError

_SOURCE = r"""
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {
struct Entry { size_t bytes; int64_t window; };
std::mutex lock;
std::unordered_map<void*, Entry> live;
int64_t total = 0, window = 0, held = 0, peak = 0;  // held and peak: this window's allocations only
c10::Allocator* base = nullptr;
c10::DeleterFnPtr base_delete = nullptr;

void counted_delete(void* ptr) {
  {
    std::lock_guard<std::mutex> guard(lock);
    auto it = live.find(ptr);
    if (it != live.end()) {
      total -= it->second.bytes;
      if (it->second.window == window) held -= it->second.bytes;
      live.erase(it);
    }
  }
  base_delete(ptr);
}

struct Counting final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base->allocate(n);
    void* ptr = inner.get();
    c10::Device device = inner.device();
    inner.release_context();  // (the base's context is its data pointer: checked at install)
    if (ptr != nullptr) {
      std::lock_guard<std::mutex> guard(lock);
      live[ptr] = Entry{n, window};
      total += n;
      held += n;
      if (held > peak) peak = held;
    }
    return {ptr, ptr, &counted_delete, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base->copy_data(dest, src, count);
  }
};
Counting counting;
}  // namespace

extern "C" {
// 0: installed (or already); 1: torch's CPU allocator has no raw deleter; 2: another allocator took precedence
int tandem_install() {
  if (c10::GetCPUAllocator() == &counting) return 0;
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current->raw_deleter() == nullptr) return 1;
  base = current;
  base_delete = current->raw_deleter();
  c10::SetCPUAllocator(&counting, 0);
  return c10::GetCPUAllocator() == &counting ? 0 : 2;
}
void tandem_begin() { std::lock_guard<std::mutex> guard(lock); ++window; held = 0; peak = 0; }
int64_t tandem_held() { std::lock_guard<std::mutex> guard(lock); return held; }
int64_t tandem_peak() { std::lock_guard<std::mutex> guard(lock); return peak; }
int64_t tandem_total() { std::lock_guard<std::mutex> guard(lock); return total; }
}
"""

_loaded: ctypes.CDLL | None = None
_guard = threading.Lock()


def _cache_dir() -> str:
    return os.environ.get("TANDEM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tandem")


def _build(path: str) -> None:
    """Compile the allocator into `path` (under a file lock: the ranks of a job build it once between them)."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise ConfigError(
            "measuring CPU memory needs a C++ compiler (c++ or g++, or CXX) to build Tandem's counting allocator "
            "once: install one (Debian: apt-get install g++)."
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):
            return
        src, tmp = path[:-3] + ".cpp", f"{path}.{os.getpid()}.tmp"
        with open(src, "w") as f:
            f.write(_SOURCE)
        lib = cpp_extension.library_paths()[0]
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        cmd = [
            compiler,
            "-O2",
            "-std=c++17",
            "-shared",
            "-fPIC",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            src,
            "-o",
            tmp,
        ]
        cmd += [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise ConfigError(
                f"building Tandem's counting CPU allocator failed ({' '.join(cmd)}):\n{run.stderr}"
            )
        os.replace(tmp, path)


def counting_allocator() -> ctypes.CDLL:
    """The counting allocator, installed as torch's CPU allocator (built on first use)."""
    global _loaded
    with _guard:
        if _loaded is None:
            key = hashlib.sha256(f"{_SOURCE}{torch.__version__}{sys.version_info[:2]}".encode()).hexdigest()[
                :16
            ]
            path = os.path.join(_cache_dir(), f"counting_allocator_{key}.so")
            if not os.path.exists(path):
                _build(path)
            lib = ctypes.CDLL(path)
            for name in ("tandem_held", "tandem_peak", "tandem_total"):
                getattr(lib, name).restype = ctypes.c_int64
            status = lib.tandem_install()
            if status != 0:
                raise ConfigError(
                    "Tandem's counting allocator cannot stand in front of torch's CPU allocator here ("
                    + ("it has no raw deleter" if status == 1 else "another allocator was set with priority")
                    + "): CPU memory cannot be measured in this process."
                )
            _loaded = lib
        return _loaded
