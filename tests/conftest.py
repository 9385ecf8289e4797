pytest_plugins = ["tests.plugins.spark"]
