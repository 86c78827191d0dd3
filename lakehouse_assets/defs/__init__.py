"""Dagster objects only: resources, assets, checks, jobs and sensors built from the configuration."""
