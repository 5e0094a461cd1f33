"""``jetspec {demo,generate,info}`` (the console script; also ``python -m jetspec_kernels``).

Bad command lines print one line ``jetspec: error: ...`` to stderr and exit with status 2.
``jetspec --help`` imports neither torch nor the ops (the package loads them on first use).
"""
import sys

from .cli_common import PROG, Parser, UsageError, report


def main(argv=None) -> int:
    """Run a subcommand; returns the process exit status."""
    parser = Parser(prog=PROG)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{demo,generate,info}")
    sub.add_parser("demo", help="the shipped tiny models decoding Python source (jetspec_kernels/demo.py)",
                   add_help=False)
    sub.add_parser("generate", help="speculative decoding: --tiny, or --target DIR --head DIR",
                   add_help=False)
    sub.add_parser("info", help="version and which backends can run here")
    try:
        args, rest = parser.parse_known_args(argv)
        if args.cmd == "info" and rest:
            raise UsageError(f"info takes no arguments, got {' '.join(rest)}")
    except UsageError as e:
        return report(str(e))
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
    for dev in ["cpu", "cuda"]:
        here = dev == "cpu" or torch.cuda.is_available()
        print(f"  auto on {dev} tensors" + ("" if here else " (no GPU here: by the tables alone, "
                                                         "as where every backend loads)"))
        for fn in _backend.INTERFACE_FUNCTIONS:
            name, why = _backend.auto_choice(fn, dev, machine=here)
            print(f"    {fn:21s} {name:10s} {why}")
    try:
        from . import _C
    except ImportError:
        return 0
    driver = _C.driver_version()
    from .cuda.availability import cuda_version
    print(f"  _C links the CUDA {cuda_version(_C.runtime_version())} runtime; driver: "
          + (f"CUDA {cuda_version(driver)}" if driver else "none found"))
    wgmma = "has" if _C.wgmma_built() else "lacks"
    print(f"  _C built for {_C.built_archs()}: {wgmma} the sm_90a wgmma attention kernels "
          f"(auto; kernel='hopper' for the Hopper family)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
