"""Chaos tests: disposable RabbitMQ and Postgres, real processes killed at random."""
