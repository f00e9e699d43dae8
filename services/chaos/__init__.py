"""``fatura chaos run``: the whole stack as processes on resources of its own, one fault family at a
time, and the invariants that must hold after each."""
