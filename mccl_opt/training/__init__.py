"""End-to-end training under gray failures (paper §6.3, docs/training.md): the layered
``mccl-workload/1`` format, built-in Llama 3.1 405B and DeepSeek-v3 stages, parallel
groups placed on a fabric, concurrent communicators sharing links, iteration times and
the joint re-synthesis of communicators that cross the same degraded link."""
