"""Grading side of the course: nbgrader configuration, the grading command and its samples.

Run `python -m autograder --help`. Nothing here is shipped to students.
"""
import sys

# jsonschema's checker for the "iri" format (the package rfc3987_syntax) builds a parser when it is
# imported: about 3 CPU-seconds in every process that reads a notebook, since nbformat validates
# with jsonschema. No notebook schema uses that format, so every grading process skips it (nbgrader's
# worker processes too: grader._BOOT).
sys.modules.setdefault("rfc3987_syntax", None)
