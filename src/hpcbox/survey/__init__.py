"""Knowing a site: `hpcbox doctor` (what a cluster has against what its profile says, and whether its
compute side runs hpcbox's SIFs) and `hpcbox profile.draft` (a profile written from what the site
answers). Each asks over one SSH connection and reads the answers as findings."""
