"""Grading side of the course: nbgrader configuration, the grading command and its samples.

Run `python -m autograder --help`. Nothing here is shipped to students.
"""
