"""A tiny module with a bug for Berth's example mission."""


def add(a, b):
    return a - b
