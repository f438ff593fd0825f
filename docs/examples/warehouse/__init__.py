"""The warehouse service: its actions served with the saga adapter SDK (saga_services.sdk)."""
