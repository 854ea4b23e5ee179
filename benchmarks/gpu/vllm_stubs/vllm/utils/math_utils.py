"""vllm.utils.math_utils.next_power_of_2."""


def next_power_of_2(n: int) -> int:
    return 1 if n < 1 else 1 << (n - 1).bit_length()
