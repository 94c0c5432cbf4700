"""Results and plots: reading run folders, reports, equal-bytes comparisons, participation and regime studies."""
