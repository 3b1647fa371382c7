"""Benchmarks: one script per measured claim, each printing our figure beside its anchor's."""
