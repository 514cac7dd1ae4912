"""The changelog engine: SQL front end, planner and stages, free of Spark, Kafka and HTTP."""
