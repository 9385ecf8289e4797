pytest_plugins = ["tests.plugins.postgres", "tests.plugins.spark"]

