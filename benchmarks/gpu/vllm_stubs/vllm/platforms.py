"""vllm.platforms.current_platform: CUDA, with the device's capability."""
import torch


class _Cuda:
    @staticmethod
    def is_cuda():
        return True

    @staticmethod
    def _capability():
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor

    def is_device_capability(self, capability):
        return self._capability() == capability

    def has_device_capability(self, capability):
        return self._capability() >= capability


current_platform = _Cuda()
