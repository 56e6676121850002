"""Pure-Python domain logic: no HTTP, no SQL.

Capacity math, request-group parsing, provider trees and the
allocation-candidate solver live here so they can be tested with plain data.
"""
