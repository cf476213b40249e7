"""qcoll: quantized collective communication (https://github.com/ — the C++ library's
Python bridge). ``import qcoll.torch`` registers the torch.distributed backend
"qcoll"; ``qcoll.torch.hooks`` has the DDP communication hook. docs/pytorch.md."""
