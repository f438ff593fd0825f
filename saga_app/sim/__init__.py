"""Deterministic simulation of the whole system in one process and one thread: a virtual-time
event loop (``loop``), an in-memory RabbitMQ with the semantics the system relies on
(``broker``), all driven by one seed, so that a run can be replayed bit for bit."""
