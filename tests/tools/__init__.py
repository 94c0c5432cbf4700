"""Tools for the project itself: the settings page generator and the fault-injection check of the tests."""
