"""CPU lists as taskset writes them ("0-1,4"), for the benchmarks that pin a server and its load apart."""


def cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus
