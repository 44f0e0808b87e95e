"""launch: infrastructure as code for fine-tuning LLMs on rented GPUs (the local CLI)."""

__version__ = "0.1.0"
