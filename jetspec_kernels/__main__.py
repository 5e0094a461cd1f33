"""python -m jetspec_kernels {demo,generate,info}."""
import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jetspec_kernels")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("demo", help="one speculative round end to end (see jetspec_kernels/demo.py)",
                   add_help=False)
    sub.add_parser("generate", help="speculative decoding with real checkpoints", add_help=False)
    sub.add_parser("info", help="version and which backends can run here")
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "demo":
        from .demo import main as demo_main
        return demo_main(rest)
    if args.cmd == "generate":
        from .generate_cli import main as generate_main
        return generate_main(rest)
    import torch

    import jetspec_kernels as jk
    from jetspec_kernels import backend as _backend
    print(f"jetspec_kernels {jk.__version__}, torch {torch.__version__}")
    for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        for name, reason in jk.available_backends(dev).items():
            print(f"  {dev:5s} {name:10s} {'ok' if reason is None else reason}")
    verified = [fn for fn in _backend.INTERFACE_FUNCTIONS if fn in _backend.HARDWARE_VERIFIED["cuda"]]
    if verified:
        print(f"  auto on CUDA tensors: cuda for {', '.join(verified)}; triton for the rest")
    else:
        print("  auto on CUDA tensors: triton for every op (no cuda kernel has passed on a GPU yet; "
              "backend='cuda' runs them)")
    try:
        from . import _C
    except ImportError:
        return 0
    driver = _C.driver_version()
    print(f"  _C links the CUDA {_backend._cuda_version(_C.runtime_version())} runtime; driver: "
          + (f"CUDA {_backend._cuda_version(driver)}" if driver else "none found"))
    wgmma = "has" if _C.wgmma_built() else "lacks"
    print(f"  _C built for {_C.built_archs()}: {wgmma} the sm_90a wgmma attention kernels "
          f"(auto; kernel='tma' for the warp-specialised TMA one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
