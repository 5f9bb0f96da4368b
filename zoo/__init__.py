"""The draft zoo: find, build, profile and rank drafts for a target (``zoo --help``)."""
