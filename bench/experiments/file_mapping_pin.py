"""Which file mappings cudaHostRegister accepts on this host (kernel, filesystem, mmap flags, register flags): the
facts behind PinnedEmbedding.open's pinning (docs/persistence.md). Prints one line per combination."""
import ctypes
import mmap
import os
import platform

import torch

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
rt = torch.cuda.cudart()
torch.cuda.init()
print("kernel", platform.release())
torch.empty(1, device="cuda")
cudart_path = next(line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line)
cudart = ctypes.CDLL(cudart_path)
value = ctypes.c_int(-1)
cudart.cudaDeviceGetAttribute(ctypes.byref(value), 113, 0)  # cudaDevAttrHostRegisterReadOnlySupported
print("cudaDevAttrHostRegisterReadOnlySupported", value.value)
size = 64 << 20
for folder in ("/tmp", "/dev/shm", os.getcwd()):
    path = os.path.join(folder, "pin_probe.bin")
    with open(path, "wb") as f:
        f.truncate(size)
    os.system(f"stat -f -c 'fs %T' {folder}")
    for name, prot, flags, oflag in (("shared-ro", mmap.PROT_READ, mmap.MAP_SHARED, os.O_RDONLY),
                                      ("shared-rw", mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, os.O_RDWR),
                                      ("private-rw", mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, os.O_RDONLY),
                                      ("private-ro", mmap.PROT_READ, mmap.MAP_PRIVATE, os.O_RDONLY)):
        for reg_name, reg in (("mapped|portable", 3), ("mapped|portable|readonly", 11)):
            fd = os.open(path, oflag)
            p = libc.mmap(None, size, prot, flags, fd, 0)
            os.close(fd)
            err = rt.cudaHostRegister(p, size, reg)
            ok = int(err) == 0
            if ok:
                rt.cudaHostUnregister(p)
            else:
                cudart.cudaGetLastError()
            print(f"{folder:12s} {name:11s} {reg_name:26s} -> {err}")
            libc.munmap(p, size)
    os.remove(path)
