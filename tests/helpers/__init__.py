"""What the tests share: helpers, never tests (pytest collects nothing here)."""
