pytest_plugins = ["tests.plugins.postgres", "tests.plugins.s3", "tests.plugins.gcs", "tests.plugins.spark"]
