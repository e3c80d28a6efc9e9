"""The image as an Apptainer SIF: conversion, root filesystem, compression, the helper image, verify."""
