#!/usr/bin/env python3
"""Which BLAS PyTorch computes with here, and a refusal to time a baseline on a reference one.

A CPU baseline timed on the netlib reference BLAS (Debian's libblas3, what torch calls when
libopenblas0-openmp is not installed) runs its GEMMs about 30x slower than on OpenBLAS or
MKL, and a speed-up reported against it is inflated. Every baseline script that reports a
ratio calls require_optimised_blas() before timing on the CPU.

    python3 bench/blas_check.py          # prints the BLAS; exit 1 if it is the reference one

How it decides, after one matrix product has loaded the BLAS: a library mapped into this
process whose real path names OpenBLAS, MKL or BLIS is an optimised BLAS; torch built with
MKL (pip's wheels link it in statically) says so in torch.__config__.show(); Debian's
libblas.so.3 from /usr/lib/<arch>/blas/ (the alternative libblas3 installs) is the
reference BLAS.
"""
import os
import re
import sys

OPTIMISED = (("openblas", "OpenBLAS"), ("mkl", "MKL"), ("blis", "BLIS"), ("atlas", "ATLAS"))


def mapped_libraries():
    """Real paths of the shared libraries mapped into this process (Linux)."""
    paths = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if ".so" in path and path.startswith("/"):
                    paths.add(os.path.realpath(path))
    except OSError:
        pass
    return paths


def classify(libraries, config):
    """(name, is_reference, evidence) from the mapped libraries' real paths and the text of
    torch.__config__.show()."""
    for library in sorted(libraries):
        folder_and_name = "/".join(library.lower().split("/")[-2:])
        for key, name in OPTIMISED:
            if key in folder_and_name:
                return name, False, library
    found = re.search(r"BLAS_INFO=(\w+)", config)
    if found and found.group(1).lower() in ("mkl", "open", "openblas", "blis"):
        return found.group(1), False, "torch.__config__: BLAS_INFO=" + found.group(1)
    for library in sorted(libraries):
        if re.search(r"/libblas\.so(\.|$)", library):
            return "reference BLAS (netlib)", True, library
    return "unknown", False, "no BLAS library among the mapped ones; torch.__config__: " + \
        (found.group(0) if found else "no BLAS_INFO")


def blas_in_use():
    """(name, is_reference, evidence) of the BLAS torch's CPU matrix products use."""
    try:
        import torch
    except ImportError as error:
        sys.exit(f"error: PyTorch is not importable by {sys.executable}: {error}")
    torch.ones(64, 64) @ torch.ones(64, 64)  # loads the BLAS if torch defers it
    return classify(mapped_libraries(), torch.__config__.show())


def require_optimised_blas(what="this baseline"):
    """Exit with a message naming the fix when torch's BLAS is the reference one."""
    name, reference, evidence = blas_in_use()
    if reference:
        sys.exit(f"error: {what}: PyTorch computes with the {name} ({evidence}), about 30x "
                 "slower than an optimised BLAS, so a ratio against it would be inflated; "
                 "install libopenblas0-openmp (scripts/install-deps.sh --test does) and run again")
    return name, evidence


def main():
    name, reference, evidence = blas_in_use()
    print(f"BLAS: {name} ({evidence})")
    sys.exit(1 if reference else 0)


if __name__ == "__main__":
    main()
