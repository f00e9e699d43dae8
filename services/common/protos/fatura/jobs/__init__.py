# generated — do not edit: package marker for the generated stubs. Regenerate with `make proto` (services/common/protogen.py).
