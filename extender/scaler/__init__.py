"""The predictive scaler: demand signals, the loop, leader election and the serving process.

``extender scale`` forecasts each autoscaled workload's demand one startup-time ahead and
publishes desired replicas through the External Metrics API (extender.api.external_metrics.app),
which the stock HPA reads. The decision itself is pure (extender.core.scaler, extender.core.forecast);
this package gathers its inputs and writes its outputs. Importing it does no work.
"""
