"""The embedded-default demo (``make demo``): evaluate, train a few Stratified GRPO steps, evaluate."""
