// Builds sdk-mobile/android on its own; an app can also include it as a
// module (include(":mpush-sdk"); project(":mpush-sdk").projectDir = file(".../sdk-mobile/android")).
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}
dependencyResolutionManagement {
    repositories {
        google()
        mavenCentral()
    }
}
rootProject.name = "mpush-sdk"
