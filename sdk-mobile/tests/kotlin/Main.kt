// The Kotlin bindings on the JVM against a real mpush-server (started by
// tools/web/with-server.mjs --redis): connect, bind, receive a push, ACK it,
// up-push, reconnect after a server restart by fast connect with the stored
// ticket, a listener client, and no SDK thread left after shutdown().
import io.mpush.sdk.*
import java.io.File
import java.net.URI
import java.net.http.HttpClient
import java.net.http.HttpRequest
import java.net.http.HttpResponse
import kotlinx.coroutines.*
import kotlinx.coroutines.channels.Channel
import kotlinx.coroutines.flow.collect
import kotlin.system.exitProcess

val tcp: String = System.getenv("MPUSH_TEST_TCP") ?: error("MPUSH_TEST_TCP is not set: run through scripts/test-mobile")
val api: String = System.getenv("MPUSH_TEST_API") ?: error("MPUSH_TEST_API is not set")
val control: String = System.getenv("MPUSH_TEST_CONTROL") ?: error("MPUSH_TEST_CONTROL is not set")
val http: HttpClient = HttpClient.newHttpClient()

var passed = 0
var failed = 0

fun check(name: String, ok: Boolean, detail: () -> String = { "" }) {
    if (ok) { passed++; println("ok   $name") } else { failed++; println("FAIL $name ${detail()}") }
}

fun post(url: String, json: String): String =
    http.send(
        HttpRequest.newBuilder(URI.create(url)).header("content-type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(json)).build(),
        HttpResponse.BodyHandlers.ofString(),
    ).body()

fun get(url: String): String =
    http.send(HttpRequest.newBuilder(URI.create(url)).GET().build(), HttpResponse.BodyHandlers.ofString()).body()

fun field(json: String, name: String): String? = Regex("\"$name\":\"([^\"]*)\"").find(json)?.groupValues?.get(1)

fun sdkThreads(): Int =
    File("/proc/self/task").listFiles().orEmpty().count { runCatching { File(it, "comm").readText().trim() == "mpush-sdk" }.getOrDefault(false) }

/** The app's ticket store (SharedPreferences in an app). */
class MapStore : SessionStore {
    @Volatile var ticket: String? = null
    override fun load(): String? = ticket
    override fun save(ticket: String) { this.ticket = ticket.ifEmpty { null } }
}

suspend fun <T : Any> Channel<PushEvent>.expect(what: String, ms: Long = 15000, pick: (PushEvent) -> T?): T =
    withTimeoutOrNull(ms) {
        while (true) { pick(receive())?.let { return@withTimeoutOrNull it } }
        @Suppress("UNREACHABLE_CODE") null
    } ?: error("timed out waiting for $what")

suspend fun waitTrace(trace: String, state: String): Boolean {
    repeat(100) {
        if (get("$api/api/v1/traces/$trace").contains("\"state\":\"$state\"")) return true
        delay(50)
    }
    return false
}

val root: File = generateSequence(File("").absoluteFile) { it.parentFile }
    .first { File(it, "sdk-core/testdata/error-codes.json").exists() }

/** Every shared protocol vector, checked by the library the app links. */
fun vectors() {
    val files = File(root, "protocol/testdata/vectors").listFiles { f -> f.name.endsWith(".json") }.orEmpty().sortedBy { it.name }
    val names = files.map { checkVector(it.readText()) }
    check("every shared protocol vector matches (${names.size})", names.size == files.size && names.size >= 20 && "v2_keys" in names) { "$names" }
    try {
        checkVector("""{"name": "x", "kind": "packet", "hex": "00", "fields": {}}""")
        check("a broken vector is an error", false)
    } catch (e: PushException.InvalidInput) {
        check("a broken vector is an error with code invalid_input", e.code() == "invalid_input")
    }
}

/** The one (error, code) table of every SDK: sdk-core/testdata/error-codes.json. */
fun checkErrorTable() {
    val text = File(root, "sdk-core/testdata/error-codes.json").readText()
    val want = Regex("\"code\": \"([a-z_]+)\",\\s*\"retryable\": (true|false)").findAll(text)
        .map { it.groupValues[1] to (it.groupValues[2] == "true") }.toList()
    val got = errorTable().map { it.code() to it.retryable() }
    check("every error kind has the shared code and retryable flag (${want.size})", want.size >= 11 && got == want) { "$got vs $want" }
}

fun main(): Unit = runBlocking {
    val user = "kotlin-${ProcessHandle.current().pid()}"
    try {
        check("the library loads (sdk ${sdkVersion()})", sdkVersion().isNotEmpty())
        vectors()
        checkErrorTable()
        val store = MapStore()
        val config = PushConfig(servers = listOf(tcp), deviceId = "$user-phone", osName = "android", osVersion = "14",
            backoffInitialMs = 300uL, backoffMaxMs = 1000uL)
        val client = PushClient(config, store, null)
        val events = Channel<PushEvent>(Channel.UNLIMITED)
        val collector = launch(Dispatchers.IO) { client.events().collect { events.send(it) } }
        client.connect()
        val c1 = events.expect("connected") { it as? PushEvent.Connected }
        check("connected over TCP with the v2 profile", c1.v2 && !c1.resumed) { "$c1" }
        check("an SDK thread runs", sdkThreads() >= 1)

        client.bind(user, listOf("kotlin", "beta"), null)
        check("bind returns once the server accepted it", get("$api/api/v1/users/$user").contains("\"online\":true"))
        check("state() says connected", client.state() == ConnectionState.CONNECTED) { "${client.state()}" }

        val r = post("$api/api/v1/push", """{"userId":"$user","content":"hello kotlin","ackMode":"biz"}""")
        val trace = field(r, "traceId") ?: error("no traceId in $r")
        val m = events.expect("the push") { (it as? PushEvent.Message)?.message }
        check("a push arrives with its content and ids", String(m.content) == "hello kotlin" && m.needsAck && m.messageId != null && m.traceId == trace) { "$m" }
        client.ack(m.id)
        check("the ACK reaches the server (trace ACK)", waitTrace(trace, "ACK"))

        client.push("up from kotlin ✓".toByteArray(), true)
        // Accepted means the backend's webhook has it: exactly as sent, signed.
        val hooked = get("$control/webhook/events")
        check("the up-push arrived at the webhook, exactly as sent", hooked.contains("\"userId\":\"$user\"") && hooked.contains("up from kotlin ✓")) { hooked }
        check("every webhook signature verified", hooked.contains("\"badSignatures\":0")) { hooked }
        check("the resume ticket is in the app's store", store.ticket?.startsWith("v2,") == true) { "${store.ticket}" }

        // The server restarts (cluster mode on Redis: sessions survive it).
        post("$control/restart", "")
        events.expect("disconnected") { it as? PushEvent.Disconnected }
        val c2 = events.expect("reconnected", 20000) { it as? PushEvent.Connected }
        check("after a server restart: fast connect with the stored ticket", c2.resumed) { "$c2" }
        events.expect("re-bound") { (it as? PushEvent.Bound)?.takeIf { b -> b.userId == user } }
        post("$api/api/v1/push", """{"userId":"$user","content":"after restart","ackMode":"auto"}""")
        val m2 = events.expect("the push after the restart") { (it as? PushEvent.Message)?.message }
        check("the user was re-bound and receives pushes", String(m2.content) == "after restart")

        try {
            PushClient(config.copy(servers = emptyList()), null, null)
            check("an invalid config is refused", false)
        } catch (e: PushException.InvalidInput) {
            check("an invalid config is refused with code ${e.code()}", e.code() == "invalid_input")
        }

        // A listener instead of next_event: callbacks on the SDK's thread.
        val heard = Channel<PushEvent>(Channel.UNLIMITED)
        val second = PushClient(config.copy(deviceId = "$user-tablet"), null, object : PushListener {
            override fun onEvent(event: PushEvent) { heard.trySend(event) }
        })
        second.connect()
        heard.expect("listener: connected") { it as? PushEvent.Connected }
        second.shutdown()
        check("a listener gets events; shutdown() stops it", heard.expect("listener: stopped") { it as? PushEvent.Stopped } is PushEvent.Stopped)

        client.shutdown()
        withTimeout(5000) { collector.join() }
        check("shutdown(): the events Flow completes", true)
        try {
            client.push("x".toByteArray(), false)
            check("a closed client refuses calls", false)
        } catch (e: PushException.Stopped) {
            check("a closed client refuses calls (code ${e.code()})", e.code() == "stopped")
        }
        check("no SDK thread left after shutdown()", sdkThreads() == 0) { "${sdkThreads()} left" }
        check("state() says closed", client.state() == ConnectionState.CLOSED) { "${client.state()}" }
    } catch (e: Throwable) {
        failed++
        println("FAIL ${e.stackTraceToString()}")
    }
    println("kotlin: $passed passed, $failed failed")
    exitProcess(if (failed == 0) 0 else 1)
}
