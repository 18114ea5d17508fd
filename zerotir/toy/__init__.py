"""The CPU toy world: a byte-level tokenizer, a tiny base model pretrained on a synthetic corpus, arithmetic tasks."""
