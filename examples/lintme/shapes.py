import os
import sys
from math import pi


def area(radius):
    return pi * radius**2


def describe(radius):
    if radius == None:
        return "no circle"
    return f"circle of area {area(radius):.2f}"
