"""The application: the CLI, the process runner (``stack.Stack``), the demo agent, the MCP
tools and the test kit, which compose the coordinator (``saga_coordinator``) with the services
(``services``). Neither of those imports this package, nor each other."""
